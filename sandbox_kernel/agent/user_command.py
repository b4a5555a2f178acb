# Started as `python3 -I -c <this file> CMD [ARG...]`: becomes CMD as the user's own
# command (`sandbox-kernel exec`, a terminal, an agent's shell command), with the user's
# ~/.local/bin first on PATH, where `pip install --user` puts scripts. The sandbox's own
# PATH leaves that folder out, so that the host's programs never find a `python3` a
# cell planted there; cells get it from the agent (agent.use_user_path). Small enough
# to type into a terminal; Python 3.8 syntax, stdlib only.
import os
import sys


def main():
    mine = os.path.expanduser("~/.local/bin")
    path = os.environ.get("PATH", "")
    if mine not in path.split(os.pathsep):
        os.environ["PATH"] = mine + os.pathsep + path if path else mine
    command = sys.argv[1:]
    try:
        os.execvp(command[0], command)
    except OSError as exc:  # as a shell says it: 127 not found, 126 not runnable
        missing = isinstance(exc, FileNotFoundError)
        what = "command not found in the sandbox" if missing else exc.strerror
        sys.stderr.write("%s: %s\n" % (command[0], what))
        sys.stderr.flush()
        os._exit(127 if missing else 126)


if __name__ == "__main__":
    main()
