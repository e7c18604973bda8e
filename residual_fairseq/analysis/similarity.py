"""How alike two layers' representations are, over the same tokens.

Both measures take token matrices of shape (tokens, features): one row per
non-pad position, the same positions in the same order for both layers.
"""
import torch
from torch import Tensor


def mean_token_cosine(a: Tensor, b: Tensor) -> float:
    """Cosine similarity of each token's two vectors, averaged over tokens.

    1 when every token's representation only changed scale between the layers, 0
    when it turned orthogonal; this is the measure behind the "representation
    collapse" of Pre-LN's upper layers.
    """
    _check_pair(a, b)
    return torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1).mean().item()


def linear_cka(a: Tensor, b: Tensor) -> float:
    """Linear centered kernel alignment (Kornblith et al., 2019).

    Compares the two layers' token-by-token similarity structure, so it is
    invariant to any orthogonal transform and to isotropic scaling of either
    layer, and the layers may differ in width.
    """
    _check_pair(a, b, same_width=False)
    a = a.double() - a.double().mean(dim=0, keepdim=True)
    b = b.double() - b.double().mean(dim=0, keepdim=True)
    # ||b^T a||_F^2 / (||a^T a||_F ||b^T b||_F): the feature-space form, cheap
    # when there are many more tokens than features.
    cross = torch.linalg.matrix_norm(b.T @ a) ** 2
    norms = torch.linalg.matrix_norm(a.T @ a) * torch.linalg.matrix_norm(b.T @ b)
    return (cross / norms).item()


def _check_pair(a: Tensor, b: Tensor, same_width: bool = True) -> None:
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"expected (tokens, features) matrices, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[0] != b.shape[0] or (same_width and a.shape[1] != b.shape[1]):
        raise ValueError(f"token matrices do not match: {tuple(a.shape)} vs {tuple(b.shape)}")
