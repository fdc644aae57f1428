"""The ART·E question sets as they come out of the shared Enron mailboxes: the mix, what was dropped, examples.

    .venv/bin/python evals/art_e_questions.py [--db out/art-e/inbox.db] [--out evals/reports/art_e/questions.md]
    .venv/bin/python -m evals.art_e_questions --audit-sample 50 --seed 3 [--audit-kinds figure,date]

With --audit-sample N it prints N of the generated questions (the generator's seed 0, drawn by --seed) with their
source emails instead, for a person to read (`evals/art_e/audit.py`).

Builds the inbox database from every shared mailbox if --db does not exist, generates the offline questions
(`generate_scenarios`, default split), loads the annotated set into a copy of the database, and writes one
Markdown report: the build's counts, questions per split and kind with mean how_realistic and sources, the
generator's and the annotated filter's drops by reason, and a few questions of each kind.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
from pathlib import Path

from evals.art_e.annotated import drop_seen_in, load_annotated
from evals.art_e.inbox import ENRON_DIR, build_inbox_db, mailbox_owners
from evals.art_e.questions import GenerationReport, generate_scenarios, question_mix


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, default=Path("out/art-e/inbox.db"))
    ap.add_argument("--per-inbox", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("evals/reports/art_e/questions.md"))
    ap.add_argument("--audit-sample", type=int, metavar="N",
                    help="print N generated questions (drawn by --seed, both splits) with their source emails' "
                         "headers and bodies, for reading; writes no report")
    ap.add_argument("--audit-kinds", default=None, metavar="K1,K2",
                    help="with --audit-sample: draw only from these kinds (e.g. figure,date,place,phone,reply)")
    args = ap.parse_args(argv)
    if args.audit_sample is not None:
        if args.audit_sample < 1:
            ap.error("--audit-sample must be >= 1")
        if not args.db.is_file():
            ap.error(f"no inbox database at {args.db}: run once without --audit-sample to build it")
        from evals.art_e.audit import audit_sample, render_audit

        scenarios = generate_scenarios(args.db, per_inbox=args.per_inbox, seed=0)
        if args.audit_kinds:
            kinds = set(args.audit_kinds.split(","))
            unknown = kinds - {s.kind for s in scenarios}
            if unknown:
                ap.error(f"--audit-kinds: no generated questions of kind {', '.join(sorted(unknown))}")
            scenarios = [s for s in scenarios if s.kind in kinds]
        print(render_audit(audit_sample(args.db, scenarios, args.audit_sample, args.seed)), end="")
        return
    lines = ["# ART·E questions from the shared Enron mailboxes", "",
             f"Made by `evals/art_e_questions.py --per-inbox {args.per_inbox} --seed {args.seed}`.", ""]
    if not args.db.is_file():
        args.db.parent.mkdir(parents=True, exist_ok=True)
        build = build_inbox_db(sorted(ENRON_DIR.glob("*.tar.gz")), args.db)
        lines += ["## The inbox database", "",
                  f"{build.emails} emails kept of {sum(build.files.values())} files; skipped: "
                  + ", ".join(f"{n} {why}" for why, n in build.skipped.most_common()) + ".", ""]
    owners = mailbox_owners(args.db)
    report = GenerationReport()
    scenarios = generate_scenarios(args.db, per_inbox=args.per_inbox, seed=args.seed, report=report)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "annotated.db"
        shutil.copy(args.db, copy)
        annotated, _, skipped = load_annotated(ENRON_DIR / "enron_annotated.json", copy)
        annotated, seen = drop_seen_in(annotated, copy, {s.inbox_address for s in scenarios if s.split == "train"})
        if seen:
            skipped["its email is in a training inbox too"] += seen
    mix = question_mix(scenarios + annotated)
    lines += ["## Inboxes and splits", "", "| mailbox | inbox (address) | split | questions |", "|---|---|---|---|"]
    for name, address in owners.items():
        lines.append(f"| {name} | {address} | {report.inboxes.get(address, '-')} | "
                     f"{sum(s.inbox_address == address for s in scenarios)} |")
    mix_note = ("`human` is the annotated set (its own inboxes, all test). `sender` (\"Who emailed me about "
                "<subject>?\") is made for training inboxes only. How many references are wrong, by reading samples "
                "of these questions with their emails: `question-audit.md`.")
    lines += ["", "## The mix", "", mix_note, "",
              "| split | kind | questions | mean how_realistic | mean source emails |", "|---|---|---|---|---|"]
    for r in mix.itertuples(index=False):
        lines.append(f"| {r.split} | {r.kind} | {r.questions} | {r.how_realistic:.2f} | {r.sources:.2f} |")
    lines += ["", (f"Total: {len(scenarios)} generated ({sum(s.split == 'test' for s in scenarios)} test), "
                   f"{len(annotated)} annotated."), "", "## Dropped by the generator", "",
              "| reason | candidates |", "|---|---|"]
    lines += [f"| {why} | {n} |" for why, n in sorted(report.dropped.items())]
    lines += ["", "## Dropped from the annotated set (563 answerable of 674)", "", "| reason | questions |", "|---|---|"]
    lines += [f"| {why} | {n} |" for why, n in skipped.most_common()]
    lines += ["", "## Examples (random, per kind)", ""]
    rng = random.Random(args.seed)
    for kind in sorted({s.kind for s in scenarios + annotated}):
        pool = [s for s in scenarios + annotated if s.kind == kind]
        for s in rng.sample(pool, min(4, len(pool))):
            lines.append(f"- *{kind}* ({s.split}, how_realistic {s.how_realistic}): {s.question} → `{s.answer}`")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(args.out.read_text())


if __name__ == "__main__":
    main()
