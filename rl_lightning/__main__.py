"""``python -m rl_lightning``."""

import sys

if __name__ == "__main__":
    from rl_lightning.cli.process import pause_gc_for_startup

    pause_gc_for_startup()
    try:
        from rl_lightning.cli import main
        from rl_lightning.cli.process import exit_process
    except KeyboardInterrupt:  # Ctrl-C while Python is still importing: nothing started, nothing to save
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    exit_process(main())
