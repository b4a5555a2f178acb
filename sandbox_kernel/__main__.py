"""``python -m sandbox_kernel -f {connection_file}``: the kernelspec's launch command."""

from .kernel import main

if __name__ == "__main__":
    main()
