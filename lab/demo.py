"""`make demo`: what the project can show today.

The full two-cluster story of the administrator's guide replaces this once the control loop can establish a
peering in the lab. Until then it shows the parts that exist and says plainly what is not there yet. It never
fails: a part that cannot be shown is reported, not raised.
"""

from __future__ import annotations

import pathlib
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _crds() -> None:
    print("== The CRDs the chart installs (charts/peering/crds/)")
    for path in sorted((ROOT / "charts/peering/crds").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        names = doc["spec"]["names"]
        columns = [c["name"] for c in doc["spec"]["versions"][0].get("additionalPrinterColumns", [])]
        print(f"  {names['kind']:<18} scope={doc['spec']['scope']:<10} shortNames={names.get('shortNames', [])}"
              f" columns={columns}")


def main() -> int:
    print("Deckhouse peering module: demo\n")
    try:
        _crds()
    except Exception as exc:  # the demo reports, it does not fail
        print(f"  (cannot show the CRDs: {exc})")
    print("\nNot there yet: the two-cluster scenario (invite, join, capabilities, paired projects, a consumer")
    print("crossing, revocation). Run `make test` for everything that is proven so far.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
