"""FAKE torch_npu.dynamo: makes ``import torchair`` work, as the real package does once torch_npu is imported.

Real (2.1.0.post17 and 2.14.0, torch_npu/dynamo/__init__.py): where the wheel ships torch_npu/dynamo/torchair/,
``sys.modules['torchair']`` becomes a lazy stand-in for that subpackage and the dynamo backend "npu" is
registered; without it, "npu" is an eager pass-through. Here the alias is the subpackage itself, made at import,
unless ``FAKE_NPU_TORCHAIR=0`` (a torch_npu without torchair, such as 1.11's: ``import torchair`` fails).
"""
import os
import sys

if os.environ.get("FAKE_NPU_TORCHAIR", "1") != "0":
    from torch_npu.dynamo import torchair

    sys.modules["torchair"] = torchair
