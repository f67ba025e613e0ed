"""Test-only (tests/sglang/engine): Python loads this at startup in every process started with
stubs/ on PYTHONPATH, SGLang's scheduler and detokenizer subprocesses included. Only with
SGLANG_USE_CPU_ENGINE=1, it (1) makes torch.get_device_module() answer torch.cpu (PyPI's torch
is a CUDA build; on a machine without a GPU SGLang's CPU engine still asks it for the module of
the default device) and (2) installs sgl_cpu_patches' post-import hooks, which put torch
versions of GPU-only functions into a few SGLang modules as they are imported. (It shadows
Debian's own sitecustomize, which only installs apport's exception hook.)"""

import os

if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1":
    try:
        import torch

        _get_device_module = torch.get_device_module

        def get_device_module(device=None):
            if device is None:
                return torch.cpu
            return _get_device_module(device)

        torch.get_device_module = get_device_module

        import sgl_cpu_patches

        sgl_cpu_patches.install()
    except Exception as e:  # never break the interpreter's startup
        import sys

        print(f"tests/sglang/engine/stubs/sitecustomize: {e!r}", file=sys.stderr)
