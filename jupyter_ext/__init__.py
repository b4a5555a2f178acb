"""Jupyter server extension for sandbox-kernel: REST handlers, thin over sandbox_kernel."""
