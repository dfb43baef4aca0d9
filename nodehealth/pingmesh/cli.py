"""`nodehealth pingmesh analyze`: localize network faults from the agents' summaries, fetched or saved;
and `nodehealth controller`, which does it for the whole cluster (controller.py).

Every `nodehealth` start builds these parsers, so fetching, bundle handling and the controller import
what they need when they run.

nodehealth/cli.py calls add_subcommands(); `python -m nodehealth.pingmesh.cli` runs them alone.
Summaries come from other nodes: each is read up to stats.MAX_SUMMARY_BYTES (fetch.py), bundles are
read as a stream (one summary in memory at a time) and bounded as a whole, and an agent that cannot
be reached or read is listed, not fatal.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Iterator, Sequence
from typing import IO, Any

from nodehealth import logs

EXIT_OK, EXIT_FAULT, EXIT_ERROR = 0, 1, 2
# A bundle is read as a stream, but its size still bounds the work: 10,000 agents' summaries of a
# few windows each (~100 KB) fit; a bundle of every agent's whole history does not, fetch fewer windows.
MAX_BUNDLE_BYTES = 1 << 30
MAX_OTHER_VALUE_CHARS = 16 << 20  # a bundle's other keys (the saved list of problems), skipped
READ_CHARS = 1 << 20
# Whitespace in a row between a bundle's values: our bundles have a newline or two; more than a
# summary's worth is padding (a small gzip can expand to gigabytes of it), refused before it costs more.
MAX_WHITESPACE_CHARS = 1 << 20
_WHITESPACE = re.compile(r"[ \t\r\n]*")
SHOWN_PROBLEMS = 20
_UNDECODED = object()


class BundleError(Exception):
    pass


def add_subcommands(subparsers: Any) -> None:
    pm = subparsers.add_parser("pingmesh", help="pingmesh across nodes (analyze)")
    sub = pm.add_subparsers(dest="pingmesh_command", required=True)
    a = sub.add_parser("analyze", help="name the node, leaf or path at fault from the agents' summaries",
                       description="Exit status: 0 no verdict (inconclusive ones are printed), 1 a node, leaf "
                                   "or path verdict, 2 nothing could be analysed or bad usage.")
    a.add_argument("--from", dest="urls", nargs="+", action="extend", default=[], metavar="URL",
                   help="agents' /v1/pingmesh endpoints (http://HOST:9456 gets the path added)")
    a.add_argument("--bundle", action="append", default=[], metavar="FILE",
                   help="a saved bundle: a JSON list of summaries (objects, or packed ones as base64 strings) or "
                        "{\"summaries\": [...]}, optionally .gz")
    a.add_argument("--save", metavar="FILE", help="write the gathered summaries as a bundle (.gz: compressed)")
    a.add_argument("--packed", action="store_true", help="ask the agents for the packed form and save it so: a "
                   "tenth of the bytes and ~4x faster to analyse again, not for reading by eye (agents that do not "
                   "know it answer JSON); a bundle may hold both forms")
    a.add_argument("--json", action="store_true", help="print the analysis as JSON")
    a.add_argument("--config", metavar="FILE", help="configuration file (YAML or .json): pingmesh.analysis, and "
                                                    "the agents' probe_interval_seconds and inventory_file")
    a.add_argument("--inventory", metavar="FILE", help="who is in the mesh, in which leaf (default: "
                   "pingmesh.inventory_file); without one, each node's leaf is what its own summary says")
    a.add_argument("--windows", type=int, metavar="N", help="newest windows asked of each agent "
                   "(default: pingmesh.fetch_windows)")
    a.add_argument("--timeout", type=float, metavar="S", help="per agent (default: pingmesh.fetch_timeout_seconds)")
    a.add_argument("--concurrency", type=int, metavar="N", help="agents fetched at once "
                   "(default: pingmesh.fetch_concurrency)")
    a.set_defaults(func=cmd_analyze)
    c = subparsers.add_parser("controller", help="the cluster-wide pingmesh analysis (a Deployment; one leader "
                                                 "writes the verdict ConfigMap)")
    c.add_argument("--config", metavar="FILE|DIR", help="the agents' configuration file (YAML or .json), or a "
                                                        "directory of them merged in name order")
    c.add_argument("--listen", metavar="ADDR:PORT", help="/metrics and /healthz (default 0.0.0.0:9458)")
    c.add_argument("--identity", metavar="NAME", help="its name in the leader Lease (default $POD_NAME, else the "
                                                      "hostname)")
    logs.add_options(c)
    c.set_defaults(func=cmd_controller)


def without_numpy(command: str) -> bool:
    """Whether numpy, which the analysis adds up with (the `analysis` extra), is missing: said in one line."""
    try:
        import numpy  # noqa: F401
    except ImportError:
        print(f"nodehealth {command}: the pingmesh analysis needs numpy: pip install 'nodehealth[analysis]'",
              file=sys.stderr)
        return True
    return False


def cmd_controller(args: argparse.Namespace) -> int:
    if without_numpy("controller"):
        return EXIT_ERROR
    from nodehealth.pingmesh import controller  # the Kubernetes client and the analysis, only here

    return controller.cmd_controller(args)


def cmd_analyze(args: argparse.Namespace) -> int:
    if without_numpy("pingmesh analyze"):
        return EXIT_ERROR
    from nodehealth import config, inventory
    from nodehealth.pingmesh.analysis import analyze

    try:
        cfg = config.load(args.config)
    except config.ConfigError as e:
        print(f"nodehealth pingmesh analyze: {e}", file=sys.stderr)
        return EXIT_ERROR
    if not args.urls and not args.bundle:
        print("nodehealth pingmesh analyze: give agents (--from URL...) or saved bundles (--bundle FILE)",
              file=sys.stderr)
        return EXIT_ERROR
    pm = cfg["pingmesh"]
    windows = pm["fetch_windows"] if args.windows is None else args.windows
    timeout = pm["fetch_timeout_seconds"] if args.timeout is None else args.timeout
    concurrency = pm["fetch_concurrency"] if args.concurrency is None else args.concurrency
    if windows < 1 or timeout <= 0 or concurrency < 1:
        print("nodehealth pingmesh analyze: --windows and --concurrency must be at least 1, --timeout positive",
              file=sys.stderr)
        return EXIT_ERROR
    inv = None
    if args.inventory or pm["inventory_file"]:
        try:
            inv = inventory.load_file(args.inventory or pm["inventory_file"])
        except inventory.InventoryError as e:
            print(f"nodehealth pingmesh analyze: {e}", file=sys.stderr)
            return EXIT_ERROR
    problems: list[tuple[str, str]] = []
    sources: list[Iterator[tuple[str, Any, Any]]] = [_bundle(path, problems) for path in args.bundle]
    if args.urls:
        sources.append(_fetch_all(args.urls, windows, timeout, concurrency, problems, args.packed))
    saver = None
    try:  # the only files written are the saved bundle's: an OSError here is about it
        saver = _Saver(args.save) if args.save else None
        analysis = analyze(_decoded(sources, problems, saver), pm["analysis"], inv=inv,
                           probe_interval=pm["probe_interval_seconds"])
        if saver:
            saver.close(problems)
    except OSError as e:
        print(f"nodehealth pingmesh analyze: cannot write {args.save}: {e.strerror or e}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        if saver:
            saver.abort()
    if args.json:
        doc = analysis.to_dict()
        doc.update(windows_seen=analysis.windows_seen, window_starts=analysis.window_starts, notes=analysis.notes,
                   rejected=[{"summary": s, "reason": r} for s, r in analysis.rejected],
                   unreadable=[{"source": s, "reason": r} for s, r in problems])
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    else:
        sys.stdout.write(_table(analysis, problems))
        if inv is None:
            print("nodehealth pingmesh analyze: no inventory (--inventory): each node's leaf is what its own "
                  "summary says, and nodes no inventory lists are analysed too", file=sys.stderr)
        for source, why in (problems + analysis.rejected)[:SHOWN_PROBLEMS]:
            print(f"nodehealth pingmesh analyze: {source}: {why}", file=sys.stderr)
        if len(problems) + len(analysis.rejected) > SHOWN_PROBLEMS:
            print(f"nodehealth pingmesh analyze: ... and {len(problems) + len(analysis.rejected) - SHOWN_PROBLEMS} "
                  "more (--json lists them all)", file=sys.stderr)
    if not analysis.windows_seen:
        if not args.json:
            print("nodehealth pingmesh analyze: no closed window could be analysed", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_FAULT if any(v.kind != "inconclusive" for v in analysis.verdicts) else EXIT_OK


def _table(analysis: Any, problems: list[tuple[str, str]]) -> str:
    rows = [("KIND", "ELEMENT", "SINCE", "WINDOWS", "MESSAGE")]
    for v in analysis.verdicts:
        rows.append((v.kind, v.element, _when(v.since), str(v.windows), v.message))
    if len(rows) > 1:
        widths = [max(len(r[k]) for r in rows) for k in range(4)]
        lines = ["  ".join(r[k].ljust(widths[k]) for k in range(4)) + "  " + r[4] for r in rows]
    else:
        lines = ["no verdict"]
    seen = analysis.window_starts
    span = f" ({_when(seen[0])} to {_when(seen[-1] + analysis.window_seconds)})" if seen else ""
    lines.append(f"{analysis.nodes} nodes in {analysis.leaves} leaves, {len(seen)} windows of "
                 f"{analysis.window_seconds:g} s{span}; rejected summaries: {len(analysis.rejected)}, "
                 f"unreadable sources: {len(problems)}")
    lines += [f"note: {n}" for n in analysis.notes]
    return "\n".join(lines) + "\n"


def _when(t: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _decoded(sources: list[Iterator[tuple[str, Any, Any]]], problems: list[tuple[str, str]],
             saver: _Saver | None) -> Iterator[Any]:
    """Each source's summaries, decoded; what does not decode is a problem, and the rest goes on. An
    agent's answer comes as bytes (JSON, or the packed form, which a bundle keeps as a base64 string);
    a bundle's value as its JSON text."""
    import base64
    import binascii

    from nodehealth.pingmesh import packed

    waiting: list[tuple[str, bytes]] = []
    for source in sources:
        for label, text, obj in source:
            if obj is _UNDECODED and text[:len(packed.MAGIC)] == packed.MAGIC:
                obj, text = text, json.dumps(base64.b64encode(text).decode("ascii"))
            elif obj is _UNDECODED:
                try:
                    text = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text
                    obj = json.loads(text)
                except (ValueError, RecursionError) as e:
                    problems.append((label, f"not JSON: {str(e)[:200]}"))
                    continue
            if saver:  # kept as it came, whether or not it is used: nothing gathered is lost
                saver.add(text)
            if isinstance(obj, str):
                try:
                    obj = base64.b64decode(obj, validate=True)
                except (binascii.Error, ValueError):
                    problems.append((label, "a string in a bundle is a packed summary in base64: this one is not "
                                            "base64"))
                    continue
            if isinstance(obj, bytes):  # decoded packed.CHECK_TOGETHER at a time
                waiting.append((label, obj))
                if len(waiting) == packed.CHECK_TOGETHER:
                    yield from _unpacked(waiting, problems)
                continue
            yield obj
    yield from _unpacked(waiting, problems)


def _unpacked(waiting: list[tuple[str, bytes]], problems: list[tuple[str, str]]) -> Iterator[Any]:
    """The packed answers waiting, decoded together: a summary each, or a problem; `waiting` is emptied."""
    from nodehealth.pingmesh import packed
    from nodehealth.pingmesh.stats import SummaryError

    for (label, _), got in zip(waiting, packed.loads_each([data for _, data in waiting])):
        if isinstance(got, SummaryError):
            problems.append((label, f"packed summary refused: {got}"))
        else:
            yield got
    waiting.clear()


# -- fetching ----------------------------------------------------------------------------------

def _url(raw: str, windows: int, packed: bool = False) -> str:
    import urllib.parse

    if "://" not in raw:
        raw = "http://" + raw
    parts = urllib.parse.urlsplit(raw)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"only http and https URLs, not {parts.scheme}")
    path = parts.path if parts.path not in ("", "/") else "/v1/pingmesh"
    query = parts.query
    if "windows=" not in query:
        query = f"{query}&windows={windows}" if query else f"windows={windows}"
    if packed and "format=" not in query:
        from nodehealth.pingmesh.packed import QUERY

        query = f"{query}&{QUERY}"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, query, ""))


def _fetch(url: str, timeout: float) -> bytes:
    """One summary's bytes (fetch.py bounds their size and time)."""
    from nodehealth.pingmesh.fetch import fetch

    return fetch(url, timeout)


def _fetch_all(urls: list[str], windows: int, timeout: float, concurrency: int,
               problems: list[tuple[str, str]], packed: bool) -> Iterator[tuple[str, bytes, Any]]:
    """Summaries in the order of `urls`, `concurrency` fetched at once; at most twice that many wait
    for the analysis, so memory stays bounded however many agents there are."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, min(concurrency, len(urls))), thread_name_prefix="fetch") as pool:
        pending: deque = deque()
        for raw in urls:
            try:
                url = _url(raw, windows, packed)
            except ValueError as e:
                problems.append((raw, str(e)))
                continue
            pending.append((url, pool.submit(_fetch, url, timeout)))
            if len(pending) >= 2 * concurrency:
                yield from _result(*pending.popleft(), problems)
        while pending:
            yield from _result(*pending.popleft(), problems)


def _result(url: str, future: Any, problems: list[tuple[str, str]]) -> Iterator[tuple[str, bytes, Any]]:
    from nodehealth.pingmesh.fetch import FetchError

    try:
        yield url, future.result(), _UNDECODED
    except FetchError as e:  # an agent that cannot be reached or read is listed, never fatal
        problems.append((url, str(e)))
    except Exception as e:  # nor one whose answer trips anything else
        problems.append((url, f"{type(e).__name__}: {e}"))


# -- bundles -----------------------------------------------------------------------------------

def _bundle(path: str, problems: list[tuple[str, str]]) -> Iterator[tuple[str, str, Any]]:
    """The summaries of a saved bundle, one at a time; a broken bundle stops where it breaks."""
    import codecs
    import gzip

    try:
        size = os.stat(path).st_size
        if size > MAX_BUNDLE_BYTES:
            raise BundleError(f"{size} bytes, more than {MAX_BUNDLE_BYTES}")
        with open(path, "rb") as raw:
            packed = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            stream: IO[bytes] = gzip.GzipFile(fileobj=raw) if packed else raw
            reader = _JsonStream(codecs.getreader("utf-8")(stream), path)
            for i, (text, obj) in enumerate(reader.summaries()):
                yield f"{path}[{i}]", text, obj
    except BundleError as e:
        problems.append((path, str(e)))
    except (OSError, EOFError, UnicodeDecodeError, gzip.BadGzipFile) as e:
        problems.append((path, f"cannot read: {getattr(e, 'strerror', None) or e}"))


class _JsonStream:
    """Just enough of a streaming JSON reader for a bundle: a list of values, or an object whose
    "summaries" key holds that list. Each value is cut out whole, up to a limit, with its text."""

    def __init__(self, f: IO[str], name: str) -> None:
        self.f, self.name = f, name
        self.buf, self.pos, self.read_chars, self.eof = "", 0, 0, False
        self.decoder = json.JSONDecoder()

    def _more(self) -> bool:
        if self.eof:
            return False
        chunk = self.f.read(READ_CHARS)
        if not chunk:
            self.eof = True
            return False
        self.read_chars += len(chunk)
        if self.read_chars > MAX_BUNDLE_BYTES:
            raise BundleError(f"more than {MAX_BUNDLE_BYTES} characters once decompressed")
        self.buf = self.buf[self.pos:] + chunk
        self.pos = 0
        return True

    def _peek(self) -> str:
        """The next character that is not whitespace; whitespace is skipped a chunk at a time."""
        run = 0
        while True:
            end = _WHITESPACE.match(self.buf, self.pos).end()
            run += end - self.pos
            self.pos = end
            if run > MAX_WHITESPACE_CHARS:
                raise BundleError(f"more than {MAX_WHITESPACE_CHARS} characters of whitespace in a row")
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._more():
                return ""

    def _expect(self, chars: str) -> str:
        c = self._peek()
        if not c or c not in chars:
            raise BundleError(f"expected one of {chars!r} at character {self.read_chars - len(self.buf) + self.pos}, "
                              f"found {c or 'the end'!r}")
        self.pos += 1
        return c

    def _value(self, limit: int) -> tuple[str, Any]:
        """The next JSON value, whole, and its text: read on until it decodes or passes `limit` characters."""
        self._peek()
        while True:
            try:
                obj, end = self.decoder.raw_decode(self.buf, self.pos)
            except RecursionError:
                raise BundleError("a value nested too deep") from None
            except ValueError:
                if len(self.buf) - self.pos > limit:
                    raise BundleError(f"a value longer than {limit} characters, or not JSON") from None
                if not self._more():
                    raise BundleError("not JSON, or cut short") from None
                continue
            if end == len(self.buf) and self._more():  # a number may go on in the next chunk
                continue
            text = self.buf[self.pos:end]
            self.pos = end
            return text, obj

    def summaries(self) -> Iterator[tuple[str, Any]]:
        if self._expect("[{") == "[":
            yield from self._list()
            return
        if self._peek() == "}":
            return
        while True:
            key = self._value(1024)[1]
            self._expect(":")
            if key == "summaries":
                self._expect("[")
                yield from self._list()
            else:
                self._value(MAX_OTHER_VALUE_CHARS)
            if self._expect(",}") == "}":
                return

    def _list(self) -> Iterator[tuple[str, Any]]:
        from nodehealth.pingmesh.stats import MAX_SUMMARY_BYTES

        if self._peek() == "]":
            self.pos += 1
            return
        while True:
            yield self._value(MAX_SUMMARY_BYTES)
            if self._expect(",]") == "]":
                return


class _Saver:
    """Writes the gathered summaries as a bundle, as they stream by; renamed into place when complete."""

    def __init__(self, path: str) -> None:
        import gzip
        import io

        self.path, self.tmp = path, f"{path}.tmp{os.getpid()}"
        raw = open(self.tmp, "wb")  # closed by close() or abort()
        self.f: IO[str] = io.TextIOWrapper(gzip.GzipFile(fileobj=raw, mode="wb") if path.endswith(".gz") else raw,
                                           encoding="utf-8")
        self.raw = raw
        self.count = 0
        self.f.write('{"summaries": [\n')

    def add(self, text: str) -> None:
        self.f.write((",\n" if self.count else "") + text)
        self.count += 1

    def close(self, problems: list[tuple[str, str]]) -> None:
        self.f.write('\n], "unreadable": ' + json.dumps([{"source": s, "reason": r} for s, r in problems]) + "}\n")
        self.f.close()
        self.raw.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        """After close(), nothing left to do; otherwise drop the half-written file."""
        if os.path.exists(self.tmp):
            self.f.close()
            self.raw.close()
            os.unlink(self.tmp)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="nodehealth")
    add_subcommands(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
