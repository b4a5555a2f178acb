"""``python -m sandbox_kernel -f {connection_file}``: the kernelspec's launch command.

The sandbox is sought first (see :mod:`.early_start`), before the kernel imports
Jupyter: the engine's part of the start then overlaps the kernel's own.
"""

import sys

from .early_start import begin

if __name__ == "__main__":
    begin(sys.argv[1:])
    from .kernel import main

    main()
