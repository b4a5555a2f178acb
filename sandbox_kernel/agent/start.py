"""A kernel's start program (runs INSIDE the sandbox): the sandbox's warm spare takes
the kernel's channel when one of this version waits, else a cold interpreter starts."""

from . import spare


def main():
    if not spare.hand_over():
        from .interpreter import main as interpret

        interpret()
