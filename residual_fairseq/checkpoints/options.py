"""Options of a fairseq config in any of its forms: an argparse Namespace, a dict, an omegaconf config.

Checkpoints store their config as a Namespace (``args``) or a dict (``cfg``); fairseq's
loader turns the dict into omegaconf. These accessors read and change an option in any
of them, so that the checks and the converter need not care which.
"""
import argparse

from omegaconf import OmegaConf, open_dict


def config_option(config, name):
    """An option of a fairseq config: an argparse Namespace, a dict or an omegaconf config
    (as stored in checkpoints, or built in memory); None when absent or not a config."""
    try:
        if isinstance(config, dict) or OmegaConf.is_config(config):
            return config.get(name)
    except Exception:  # noqa: BLE001  (omegaconf's struct errors: the option is absent)
        return None
    return getattr(config, name, None) if isinstance(config, argparse.Namespace) else None


def set_config_option(config, name, value):
    if OmegaConf.is_config(config):
        with open_dict(config):
            config[name] = value
    elif isinstance(config, dict):
        config[name] = value
    else:
        setattr(config, name, value)


def drop_config_option(config, name):
    if isinstance(config, argparse.Namespace):
        config.__dict__.pop(name, None)
    else:
        config.pop(name, None)


def has_option(config, name) -> bool:
    if isinstance(config, argparse.Namespace):
        return hasattr(config, name)
    return (isinstance(config, dict) or OmegaConf.is_config(config)) and name in config

