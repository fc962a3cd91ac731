"""`python -m lab.demo [--keep DIR] [--apiserver emulator|real]`: the story on two lab clusters, a and b; exit 0 when
every step ended as the guide says, 1 naming the step that did not, 130 when interrupted (Ctrl-C or SIGTERM)."""

from __future__ import annotations

import argparse
import contextlib
import pathlib
import signal
import sys
import tempfile
import time

import lab.demo as package
from lab.demo.failure import StepFailed
from lab.demo.harness import LabThread
from lab.demo.story import Story


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.demo", description=package.__doc__.splitlines()[0])
    parser.add_argument("--keep", metavar="DIR", help="keep the lab's files (kubeconfigs, logs) in DIR")
    parser.add_argument("--apiserver", choices=("emulator", "real"), default="emulator",
                        help="the clusters' API servers: the lab's emulator (default) or a real kube-apiserver")
    args = parser.parse_args(argv)
    started = time.monotonic()
    # SIGTERM ends the demo the way Ctrl-C does, so that the lab is stopped on the way out.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    print("Deckhouse peering module: the administrator's guide on two lab clusters, a and b.")
    with contextlib.ExitStack() as stack:
        work = pathlib.Path(args.keep) if args.keep else pathlib.Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="peering-demo-")))
        work.mkdir(parents=True, exist_ok=True)
        lab: LabThread | None = None
        story: Story | None = None
        try:
            print(f"Starting the lab in {work} ...", flush=True)
            lab = LabThread(work / "lab", ["a", "b"], apiserver=args.apiserver)
            lab.__enter__()
            print(f"Clusters a and b are up ({time.monotonic() - started:.1f}s). "
                  f"Each `x$` line runs kubectl with cluster x's admin kubeconfig.")
            story = Story(lab, work / "story", out=lambda s: print(s, flush=True))
            story.run_demo()
        except StepFailed as e:
            print(f"\nFAILED at {e}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("\ninterrupted; stopping the lab", file=sys.stderr)
            return 130
        except Exception as e:
            print(f"\nFAILED: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        finally:
            # A second Ctrl-C must not cut the teardown short and leave processes behind.
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            try:
                if story is not None:
                    story.close()
                if lab is not None:
                    lab.close()
                    print("The lab is stopped.")
            finally:
                signal.signal(signal.SIGINT, previous)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
        print(f"\nDone in {time.monotonic() - started:.0f}s. On Deckhouse clusters the same steps run with `d8 k`, once")
        print("  the guide's preparation is done on both (docs/guide-scenario.md: https mode, the two names, and")
        print("  user-authn with publishAPI enabled, without which Dex cannot exchange the peers' tokens).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
