"""FAKE torchair (torch_npu's graph backend) for tests only.

Real (torch_npu/dynamo/torchair/npu_fx_compiler.py, the same in 2.1.0.post17 and 2.14.0):
``get_npu_backend(*, compiler_config=None, custom_decompositions={})`` returns a torch.compile backend that
runs AOTAutograd (``aot_module_simplified``) with torchair's graph-engine compiler for the forward and the
backward graphs. Here the same AOTAutograd call, with compilers that record each graph
(``("torchair.compile", "forward" | "backward", nodes)`` in ``torch_npu.calls``) and run it eagerly.
"""
import functools

import torch_npu


class CompilerConfig:
    """Real: torchair/configs/compiler_config.py (debug, export, experimental_config, ...; 2.6 and later add
    ``mode``). Only its presence matters here."""

    def __init__(self):
        self.mode = "max-autotune"


def get_npu_backend(*, compiler_config=None, custom_decompositions={}):  # noqa: B006 (the real signature)
    config = compiler_config if compiler_config is not None else CompilerConfig()
    torch_npu._record("torchair.get_npu_backend", type(config).__name__)
    return functools.partial(_npu_backend, compiler_config=config, decompositions=custom_decompositions)


def _npu_backend(gm, example_inputs, compiler_config=None, decompositions={}):  # noqa: B006
    from functorch.compile import aot_module_simplified, make_boxed_func

    def compiler(which):
        def compile_graph(graph, inputs):
            torch_npu._record("torchair.compile", which, len(graph.graph.nodes))
            return make_boxed_func(graph.forward)
        return compile_graph

    return aot_module_simplified(gm, example_inputs, fw_compiler=compiler("forward"),
                                 bw_compiler=compiler("backward"), decompositions=decompositions)
