"""`nodehealth silence add|list|remove`: silences in this node's state directory, or, with `--kube NODE`,
in that Node's annotation, which its agent reads.

nodehealth/cli.py calls add_subcommands().
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from typing import Any, Callable

EXIT_OK, EXIT_ERROR = 0, 2
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
ANNOTATION = "silences"  # after the kube domain: nodehealth.io/silences
KUBE_ATTEMPTS = 5  # a Node that keeps changing under us (409) is read again this many times


def duration(text: str) -> float:
    """`48h`, `90m`, `2d`, `1h30m` or plain seconds, above zero."""
    text = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        seconds = float(text)
    elif text and _DURATION.sub("", text) == "":
        seconds = sum(float(n) * _UNITS[u] for n, u in _DURATION.findall(text))
    else:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (say 48h, 90m, 2d or 1h30m)")
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"a silence lasts more than 0 seconds, not {text!r}")
    return seconds


def add_subcommands(subparsers: Any) -> None:
    s = subparsers.add_parser("silence", help="acknowledge a known finding for a while (still reported, no taint, "
                                              "drain, alert or hook)")
    sub = s.add_subparsers(dest="silence_command", required=True)

    def where(p: argparse.ArgumentParser) -> None:
        p.add_argument("--state-dir", metavar="DIR", help="the daemon's state directory (default /var/lib/nodehealth)")
        p.add_argument("--kube", metavar="NODE", help="the silences of this Kubernetes Node (its annotation) "
                                                      "instead of this host's state directory")
        p.add_argument("--config", metavar="FILE", help="configuration file (YAML or .json)")

    a = sub.add_parser("add", help="silence a reason (on one device) for a while")
    a.add_argument("--reason", required=True, help="the reason code, as in the report (e.g. GpuLost)")
    a.add_argument("--device", default="", help="only on this device, as in the report (default: every device)")
    a.add_argument("--for", dest="seconds", required=True, type=duration, metavar="DURATION",
                   help="how long: 48h, 90m, 2d (at most silences.max_seconds, 30 days)")
    a.add_argument("--comment", required=True, help="why: a ticket, an RMA number")
    a.add_argument("--allow-fatal", action="store_true", help="also silence it when it is fatal (a lost GPU, a "
                                                              "double-bit error): the node takes work again")
    where(a)
    a.set_defaults(func=cmd_add)
    ls = sub.add_parser("list", help="the silences, with when each ends")
    ls.add_argument("--json", action="store_true", help="print them as JSON")
    where(ls)
    ls.set_defaults(func=cmd_list)
    rm = sub.add_parser("remove", help="end a silence now")
    rm.add_argument("id", help="the silence's id (silence list)")
    where(rm)
    rm.set_defaults(func=cmd_remove)


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    from nodehealth import config

    return config.load(args.config)


def _change(args: argparse.Namespace, cfg: dict[str, Any], edit: Callable[[list[Any]], list[Any]]) -> str:
    """Apply `edit` to the stored entries where `args` says; returns where, for the message."""
    if args.kube:
        return _change_annotation(args.kube, cfg["kube"], edit)
    from nodehealth import config
    from nodehealth.silences import store

    state_dir = config.state_dir(cfg, args.state_dir)
    store.change(state_dir, edit)
    return store.path(state_dir)


def _change_annotation(node: str, kube: dict[str, Any], edit: Callable[[list[Any]], list[Any]]) -> str:
    from nodehealth.kube.api import ClientApi, KubeError

    key = kube["domain"] + ANNOTATION
    api = ClientApi(kube["kubeconfig"], kube["request_timeout_seconds"])
    for _ in range(KUBE_ATTEMPTS):
        current = api.get_node(node)
        meta = current.get("metadata") or {}
        entries = _annotation_entries((meta.get("annotations") or {}).get(key), f"{node}'s {key}")
        text = json.dumps(edit(entries), separators=(",", ":"), sort_keys=True)
        try:
            api.patch_node(node, {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                                               "annotations": {key: text}}})
            return f"Node {node} annotation {key}"
        except KubeError as e:
            if e.kind != "conflict":
                raise
    raise KubeError("conflict", f"Node {node} kept changing; try again")


def _annotation_entries(text: str | None, where: str) -> list[Any]:
    from nodehealth.silences.store import StoreError

    if not text:
        return []
    try:
        entries = json.loads(text)
    except (ValueError, RecursionError):
        raise StoreError(f"{where} is not JSON; fix or remove it first") from None
    return [entries] if isinstance(entries, dict) else entries if isinstance(entries, list) else []


def _read(args: argparse.Namespace, cfg: dict[str, Any]) -> tuple[list[Any], str]:
    if args.kube:
        from nodehealth.kube.api import ClientApi

        key = cfg["kube"]["domain"] + ANNOTATION
        node = ClientApi(cfg["kube"]["kubeconfig"], cfg["kube"]["request_timeout_seconds"]).get_node(args.kube)
        return (_annotation_entries(((node.get("metadata") or {}).get("annotations") or {}).get(key),
                                    f"{args.kube}'s {key}"), "annotation")
    from nodehealth import config
    from nodehealth.silences import store

    return store.read_raw(config.state_dir(cfg, args.state_dir)), "file"


def _run(action: Callable[[], int]) -> int:
    """An action's exit code; what the store or the API refuses is one line on stderr."""
    from nodehealth.silences.store import StoreError

    try:
        return action()
    except StoreError as e:
        print(f"nodehealth: silence: {e}", file=sys.stderr)
    except Exception as e:  # KubeError, whose module needs the k8s extra to import
        if type(e).__name__ != "KubeError":
            raise
        print(f"nodehealth: silence: {e}", file=sys.stderr)
    return EXIT_ERROR


def cmd_add(args: argparse.Namespace) -> int:
    from nodehealth.silences.silence import new_id, parse, rfc3339

    cfg = _settings(args)
    limit = cfg["silences"]["max_seconds"]
    if args.seconds > limit:
        print(f"nodehealth: silence: --for is at most silences.max_seconds ({limit:g} s): every silence ends",
              file=sys.stderr)
        return EXIT_ERROR
    now = time.time()
    expires = now + args.seconds
    entry = {"reason": args.reason, "device": args.device, "expires": round(expires, 3), "comment": args.comment,
             "by": _who(), "created": round(now, 3), "id": new_id(args.reason, args.device, now)}
    if args.allow_fatal:
        entry["allow_fatal"] = True
    try:
        silence = parse(entry, "annotation" if args.kube else "file", "the new silence")
    except ValueError as e:
        print(f"nodehealth: silence: {e}", file=sys.stderr)
        return EXIT_ERROR

    def edit(entries: list[Any]) -> list[Any]:
        kept = [e for e in entries if not _ended(e, now)]  # expired ones go when the list is written
        if len(kept) >= cfg["silences"]["max_silences"]:
            from nodehealth.silences.store import StoreError

            raise StoreError(f"already {len(kept)} silences (silences.max_silences); remove one first")
        return [*kept, silence.to_dict()]

    def act() -> int:
        where = _change(args, cfg, edit)
        print(f"silence {silence.id} added to {where}: {args.reason} on {args.device or 'every device'} until "
              f"{rfc3339(expires)}; the daemon applies it at its next pass"
              + ("" if args.allow_fatal else " (a fatal finding stays loud without --allow-fatal)"))
        return EXIT_OK

    return _run(act)


def cmd_list(args: argparse.Namespace) -> int:
    from nodehealth.silences.silence import parse, rfc3339

    cfg = _settings(args)

    def act() -> int:
        entries, source = _read(args, cfg)
        now = time.time()
        rows = []
        for i, entry in enumerate(entries):
            try:
                s = parse(entry, source, f"{source}[{i}]")
            except ValueError as e:
                rows.append({"error": str(e)})
                continue
            rows.append(dict(s.to_dict(), source=source, until=rfc3339(s.expires), in_force=now < s.expires))
        if args.json:
            print(json.dumps(rows, indent=1, sort_keys=True))
            return EXIT_OK
        if not rows:
            print("no silences")
        for r in rows:
            if "error" in r:
                print(f"unreadable: {r['error']}")
                continue
            state = "" if r["in_force"] else " (expired)"
            fatal = " fatal-allowed" if r.get("allow_fatal") else ""
            print(f"{r['id']}  {r['reason']}  {r['device'] or '*'}  until {r['until']}{state}{fatal}  "
                  f"by {r['by'] or '?'}: {r['comment']}")
        return EXIT_OK

    return _run(act)


def cmd_remove(args: argparse.Namespace) -> int:
    cfg = _settings(args)
    found = []

    def edit(entries: list[Any]) -> list[Any]:
        kept = [e for e in entries if not (isinstance(e, dict) and e.get("id") == args.id)]
        found.append(len(kept) < len(entries))
        return kept

    def act() -> int:
        where = _change(args, cfg, edit)
        if not found[-1]:
            print(f"nodehealth: silence: no silence {args.id} in {where}", file=sys.stderr)
            return EXIT_ERROR
        print(f"silence {args.id} removed from {where}; the daemon stops applying it at its next pass")
        return EXIT_OK

    return _run(act)


def _ended(entry: Any, now: float) -> bool:
    from nodehealth.silences.silence import parse_time

    try:
        return parse_time(entry.get("expires"), "expires") <= now
    except (ValueError, AttributeError):
        return False  # not ours to drop: `silence list` shows it as unreadable


def _who() -> str:
    """Who set it: the user behind sudo, else this user."""
    import getpass

    try:
        return os.environ.get("SUDO_USER") or getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"
