"""``python -m residual_fairseq`` prints the directory to pass as fairseq's --user-dir."""
import os

# Deliberately does not import the package (and with it fairseq, ~5 s): the path is
# all a shell substitution like --user-dir "$(python -m residual_fairseq)" needs.
print(os.path.dirname(os.path.abspath(__file__)))
