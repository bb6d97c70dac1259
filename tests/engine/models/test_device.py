"""``--device``: auto takes a GPU only when there is one; cuda without one fails with what was
found, in this process and through the launcher's child-process check."""

from __future__ import annotations

import pytest
import torch

from engine.errors import ConfigError
from engine.models.device import check_here, resolve

NO_GPU = not torch.cuda.is_available()


def test_cpu_and_auto() -> None:
    assert resolve("cpu") == "cpu"
    assert resolve("auto") == ("cpu" if NO_GPU else "cuda")
    check_here("auto")  # nothing to check: no child process
    check_here("cpu")


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
@pytest.mark.parametrize("setting", ["cuda", "cuda:1"])
def test_cuda_without_a_gpu_fails_with_what_torch_sees(setting: str) -> None:
    with pytest.raises(ConfigError, match=rf"--device {setting}: torch sees 0 CUDA GPU\(s\) here"
                                          r".*use --device cpu"):
        resolve(setting)
    with pytest.raises(ConfigError, match=rf"--device {setting}: torch sees 0 CUDA GPU"):
        check_here(setting)


@pytest.mark.skipif(NO_GPU, reason="needs a GPU")
def test_cuda_with_a_gpu() -> None:
    assert resolve("cuda") == "cuda"
    check_here("cuda:0")
    with pytest.raises(ConfigError, match="torch sees"):
        resolve(f"cuda:{torch.cuda.device_count()}")
