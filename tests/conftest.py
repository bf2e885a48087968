import pytest
import torch


def pytest_collection_modifyitems(config, items):
    """Tests marked gpu run only where CUDA is available; everything else runs on the CPU."""
    if torch.cuda.is_available():
        return
    no_gpu = pytest.mark.skip(reason="marked gpu: needs an NVIDIA GPU with CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(no_gpu)
