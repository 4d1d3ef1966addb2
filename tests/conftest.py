import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tests never reach a model or dataset hub: a hub id must fail fast and clearly, as on an air-gapped box.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A fresh working directory: its own MLflow store (sqlite:///mlflow.db) and runs/ folder."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def pytest_collection_modifyitems(config, items):
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the GPU machine)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
