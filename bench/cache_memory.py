"""Memory per cached token: the verified-token cache (gateway/tokens.py VerifiedTokens) and the exchange cache
(gateway/exchange.py ExchangeCache), each filled with `--entries` tokens the way the gateway fills them, measured
with tracemalloc (every byte the cache keeps: its keys, values and the cachetools bookkeeping).

    python -m bench.cache_memory [--entries 10000] [--runs 5]

The verified cache keeps per token its SHA-256 (the key) and a VerifiedToken (peer, subject, capabilities,
expiry); the exchange cache keeps (connector, SHA-256) and (exchanged id_token, until). An id_token of Dex is
about 1 KiB (`--exchanged-bytes`), which dominates the second figure; both are printed with and without it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import statistics
import tracemalloc

from gateway.exchange import ExchangeCache
from gateway.tokens import VerifiedToken, VerifiedTokens


def _measure(fill) -> int:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    keep = fill()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del keep
    return after - before


def verified(entries: int) -> int:
    def fill():
        cache = VerifiedTokens(max_entries=entries)
        for i in range(entries):
            token_hash = hashlib.sha256(b"token-%d" % i).digest()
            # What verify_peer_token keeps: the peer's name (shared), the subject as decoded, a frozenset.
            cache._by_hash[token_hash] = VerifiedToken(peer="to-b", subject=f"system:serviceaccount:mod:sa-{i}",
                                                       capabilities=frozenset({"configmaps-watcher"}),
                                                       expires=1.8e9 + i)
        return cache
    return _measure(fill)


def exchanged(entries: int, exchanged_bytes: int) -> int:
    body = "e" * max(0, exchanged_bytes - 8)

    async def call(connector: str, token: str) -> tuple[str, float]:
        return body + token[-8:], 300.0  # a distinct string per token, as Dex's answers are

    def fill():
        async def run() -> ExchangeCache:
            cache = ExchangeCache(call, margin=30, max_entries=entries)
            for i in range(entries):
                token = "%08d" % i
                await cache.get("peering-to-b", hashlib.sha256(token.encode()).digest(), token, not_after=1e12)
            return cache
        return asyncio.run(run())
    return _measure(fill)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--exchanged-bytes", type=int, default=1024)
    args = parser.parse_args()
    n = args.entries
    rows = {
        "verified-token cache": [verified(n) / n for _ in range(args.runs)],
        f"exchange cache ({args.exchanged_bytes} B id_token)": [exchanged(n, args.exchanged_bytes) / n
                                                                for _ in range(args.runs)],
        "exchange cache (bookkeeping only)": [exchanged(n, 8) / n for _ in range(args.runs)],
    }
    print(f"bytes per cached token at {n} entries, median of {args.runs} runs (min..max):")
    for name, values in rows.items():
        print(f"  {name:42s} {statistics.median(values):8.0f}  ({min(values):.0f}..{max(values):.0f})")


if __name__ == "__main__":
    main()
