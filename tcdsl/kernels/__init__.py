"""Real kernels to apply generated scripts to, independent of the host's kernel.

``tcdsl.kernels.uml`` boots Debian's User-Mode Linux kernel as an ordinary process and runs
shell scripts in it, each in a fresh network namespace.
"""
