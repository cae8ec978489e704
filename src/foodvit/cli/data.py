"""`foodvit data`: a data source downloaded or unpacked, and what it holds."""

from __future__ import annotations

import argparse

from foodvit.cli.common import VERBOSE
from foodvit.cli.options import data_source
from foodvit.markup import terminal


def register(sub) -> None:
    """Add data to the subcommands."""
    p = sub.add_parser("data", help="download / unpack a data source and show what it holds")
    p.add_argument(
        "--data", type=data_source, help="URL, zip or folder (default: $FOODVIT_DATA, else the course's zip)"
    )
    p.add_argument("source", nargs="?", type=data_source, help="the same as --data, as a positional argument")
    p.add_argument("--print-path", action="store_true", help="print only the local folder")
    p.add_argument("--verbose", **VERBOSE)
    p.set_defaults(func=cmd_data)


DECODE_UP_TO = 10_000  # photos a split: decoded whole up to this many, their headers read beyond


def cmd_data(args: argparse.Namespace) -> int:
    from foodvit.data.datasource import DataSource
    from foodvit.data.folders import PROGRESS_FROM, check, is_food101
    from foodvit.data.photos import load_or_explain
    from foodvit.errors import ConfigError

    if args.data and args.source:
        raise ConfigError(f"two data sources given ({args.data} and {args.source}); give one, with --data")
    source = DataSource.parse(args.data or args.source)
    root = source.root()
    splits = [split for split in ("train", "test") if is_food101(root) or (root / split).is_dir()]
    # a folder without train/ and test/ is read as its class folders, as evaluate reads it: no photos there is refused
    listings = [(split, source.listing(split, root)) for split in splits] or [("photos", source.listing("test", root))]
    if args.print_path:  # the headers checked, for a path to photos that are there (make demo picks one from it)
        for _, listing in listings:
            check(listing)
        print(root)
        return 0
    # each photo decoded whole, as training decodes a data set this size, so that a file cut short counts as skipped
    # here too; past DECODE_UP_TO photos a split's headers alone (minutes of decoding for Food-101)
    shown = []
    for split, listing in listings:
        whole = len(listing.files) <= DECODE_UP_TO
        checked = check(listing, decode=load_or_explain if whole else None, quiet=len(listing.files) < PROGRESS_FROM)
        shown.append((split, checked, whole))
    print(
        terminal(
            f"data: {root}"
            + (" (Food-101 layout)" if is_food101(root) else "")
            + (f", classes {', '.join(source.classes)}" if source.classes else "")
        )
    )
    for split, s, whole in shown:
        print(
            terminal(
                f"  {split}: {len(s)} photos, {len(s.classes)} classes; "
                + ", ".join(f"{k} {v}" for k, v in list(s.counts().items())[:12])
                + (" ..." if len(s.classes) > 12 else "")
            )
        )
        for line in s.skipped_summary(args.verbose):
            print(f"  {terminal(line)}")
        if not whole:
            print(f"  (headers checked, not whole photos: over {DECODE_UP_TO:,}; training skips any it cannot decode)")
    return 0
