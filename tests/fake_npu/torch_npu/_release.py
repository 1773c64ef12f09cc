"""Which torch_npu release the fake follows: the one built for the torch it is imported under.

A torch_npu wheel is built for one torch release (its METADATA pins it) and its Python code is
written against that torch. The fake follows two wheels, whose Python sources were read:

* torch >= 2.3: torch_npu 2.14.0, ``torch_npu-2.14.0-cp311-cp311-manylinux_2_28_x86_64.whl``
  (``Requires-Dist: torch==2.14.0.*``);
* torch 2.1 and 2.2: torch_npu 2.1.0.post17,
  ``torch_npu-2.1.0.post17-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl``
  (``Requires-Dist: torch (==2.1.0+cpu)``), the torch 2.1 stack of Ascend's ModelZoo.

The line is drawn at torch 2.3, where ``torch.amp.GradScaler`` appeared: torch_npu's GradScaler
subclasses ``torch.cuda.amp.GradScaler`` up to torch_npu 2.2.0 and ``torch.amp.GradScaler`` from
2.3.1 on (``torch_npu/npu/amp/grad_scaler.py`` of those wheels). torch_npu 2.2.0 is not followed on
its own: under torch 2.2 the fake is 2.1.0.post17. torch older than 2.1 (the 1.11 stack) cannot host
the fake at all: it has no PrivateUse1 backend to rename to "npu".

Every difference between the two releases that the fake models reads ``V2_1`` from here.
"""

import re

import torch

TORCH = tuple(int(p) for p in re.findall(r"\d+", torch.__version__)[:2])
if TORCH < (2, 1):
    raise ImportError("the fake torch_npu follows torch_npu 2.1.0.post17 (torch 2.1) and 2.14.0 (torch 2.14); "
                      "torch {} has no PrivateUse1 backend to rename to 'npu'".format(torch.__version__))

V2_1 = TORCH < (2, 3)  # True: behave as torch_npu 2.1.0.post17, False: as 2.14.0
RELEASE = "2.1.0.post17" if V2_1 else "2.14.0"
WHEEL = ("torch_npu-2.1.0.post17-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl" if V2_1
         else "torch_npu-2.14.0-cp311-cp311-manylinux_2_28_x86_64.whl")
