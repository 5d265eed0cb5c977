"""``python -m pflower.deploy``: the ``pflower-deploy`` command."""

from pflower.deploy.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
