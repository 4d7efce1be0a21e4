"""A second opinion on every accepted answer: the verifier audit.

A domain's verifier can have the bugs real graders have had: it finds the answer anywhere in the
text, takes the first of several candidates, tolerates a near miss, pays partial credit for an
unsolved task. Where a task carries a reference answer, the audit re-reads each completion
independently of the verifier: it takes the final answer canonically (the text after the last
answer marker, else the last line) and compares it with the reference: one number equal to a
numeric reference (several candidate numbers are no answer), math-verify for expressions,
normalized exact match for text. Evaluation stores its verdict beside the verifier's (the
`audit` column of `rollouts`), and the harness's `verifier_audit` analyzer asks whether a
version's gain survives it.

A domain may supply its own `audit(task, completion) -> bool | None` (None: cannot tell). Domains
without reference answers (code: tests are the verifier; SWE: the repository's tests) have no
audit, and say so (`AUDITED = False`).

Where a task has one right answer (`ONE_ANSWER`: math, dataset; a custom domain unless its object
says `one_answer = False`), evaluation also stores each completion's `answer_key`: its final
answer in canonical form. Two accepted answers to the same task with different keys cannot both be
right, reference or not: the harness's `answer_agreement` analyzer reads them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction

from engine.domains.base import Domain, Task

#: Where a final answer starts: the last of these in a completion.
ANSWER_MARKER = re.compile(r"\\boxed\{|####|\bfinal answer\s*(?:is|:)|\banswer\s*(?:is|:)|(?<![A-Za-z])A\s*:", re.I)
#: A number as an answer writes it: signed integers, decimals, fractions.
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:/\d+)?")
#: A thousands separator inside a number ("1,000"): dropped before numbers are read.
THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_SPACE = re.compile(r"\s+")

Auditor = Callable[[Task, str], "bool | None"]


def final_span(completion: str) -> str:
    """The text of the final answer: after the last answer marker (inside `\\boxed{...}`, up to
    its closing brace), else the last non-empty line."""
    marks = list(ANSWER_MARKER.finditer(completion))
    if not marks:
        lines = [line for line in completion.splitlines() if line.strip()]
        return lines[-1].strip() if lines else ""
    last = marks[-1]
    rest = completion[last.end() :]
    if last.group(0).startswith("\\boxed"):
        depth = 1
        for i, ch in enumerate(rest):
            depth += {"{": 1, "}": -1}.get(ch, 0)
            if depth == 0:
                return rest[:i].strip()
    return rest.strip()


def _number(text: str) -> Fraction | None:
    try:
        return Fraction(text.lstrip("+"))
    except (ValueError, ZeroDivisionError):
        return None


def _normal(text: str) -> str:
    return _SPACE.sub(" ", text).strip().strip(".").casefold()


def canonical_audit(reference: str, completion: str) -> bool:
    """Whether the completion's final answer is the reference (see the module)."""
    span = final_span(completion)
    ref = reference.strip()
    if not span or not ref:
        return False
    if NUMBER.fullmatch(ref) and (value := _number(ref)) is not None:
        found = {_number(m) for m in NUMBER.findall(THOUSANDS.sub("", span))}
        return found == {value}  # exactly one value, the reference's; none or several is no answer
    if _normal(span) == _normal(ref):
        return True
    return _math_equal(ref, span)


def _math_equal(reference: str, span: str) -> bool:
    """math-verify's equivalence of two expressions (LaTeX or plain); False when either does not
    parse."""
    from math_verify import parse, verify

    gold, answer = parse(f"${reference}$"), parse(f"${span}$")
    return bool(gold and answer and verify(gold, answer))


def answer_key(completion: str) -> str:
    """The final answer in canonical form, for comparing two answers to one task: the value of
    the one number in the final span (`1,250`, `1250.0` and `2500/2` are one key), else the span
    normalized (spaces collapsed, case folded, a final period dropped); several numbers stay
    their whole normalized span, so two different sprays are two different answers."""
    span = THOUSANDS.sub("", final_span(completion))
    numbers = NUMBER.findall(span)
    if len(numbers) == 1 and (value := _number(numbers[0])) is not None:
        return str(value)
    return _normal(span)


def one_answer(domain: Domain) -> bool:
    """Whether each of the domain's tasks has one right answer up to equivalence (what the
    agreement of accepted answers needs): the domain's `one_answer` where it says, else its
    class's `ONE_ANSWER`."""
    own = getattr(domain, "one_answer", None)
    return bool(own) if own is not None else bool(getattr(domain, "ONE_ANSWER", False))


def auditor(domain: Domain) -> Auditor | None:
    """The audit of a domain's answers: its own `audit`, the canonical one where its tasks carry
    reference answers (`AUDITED`), else None."""
    own = getattr(domain, "audit", None)
    if callable(own):
        return own
    if getattr(domain, "AUDITED", False):
        return lambda task, completion: canonical_audit(task.answer, completion) if task.answer.strip() else None
    return None


#: Why a domain has no audit, in words, for reports.
def no_audit_reason(domain_name: str) -> str:
    return {
        "code": "no audit: code tasks have no reference answer (the unit tests are the verifier)",
        "swe": "no audit: SWE tasks have no reference answer (the repository's tests are the verifier)",
    }.get(domain_name, "no audit: the tasks carry no reference answer and the domain supplies no audit")
