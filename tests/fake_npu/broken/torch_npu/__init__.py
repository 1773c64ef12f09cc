"""A torch_npu that fails to import as the real one does when CANN's environment is not sourced (the porting
guide's FAQ "ImportError: libhccl.so"): for tests of ``--device auto`` on such a host. Tests only."""
raise ImportError("libhccl.so: cannot open shared object file: No such file or directory")
