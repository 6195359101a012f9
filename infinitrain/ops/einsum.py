"""einsum as torch.einsum spells it ("bij,bjk->bik", implicit output, "..." for broadcast
dimensions), reduced to the ops that have gradients already: each operand first sums away the
letters nothing else needs, then operands are contracted two at a time, left to right, as one
batched matrix product each (batch letters x the first's own letters x the contracted letters
against the second's), and the result is permuted into the output's order."""
from __future__ import annotations

import string

from .math import matmul

_LETTERS = string.ascii_letters


def _parse(equation: str, operands) -> tuple:
    """([subscripts per operand], output subscripts), "..." expanded into letters unused by the
    equation (as many as the operand's dimensions it stands for, the broadcast ones aligned
    from the right)."""
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise ValueError(f"einsum(): the equation has {len(terms)} operand(s) ({equation!r}), "
                         f"{len(operands)} tensor(s) were given")
    for part in terms + ([out] if arrow else []):
        bad = set(part.replace("...", "")) - set(_LETTERS)
        if bad or part.count("...") > 1 or "." in part.replace("...", ""):
            raise ValueError(f"einsum(): {part!r} in {equation!r} is not a subscript (letters and at most "
                             "one '...')")
    free = [c for c in _LETTERS if c not in eq]
    ellipsis_rank = 0
    for term, t in zip(terms, operands):
        named = len(term.replace("...", ""))
        if "..." in term:
            if t.ndim < named:
                raise ValueError(f"einsum(): operand {term!r} has {t.ndim} dimension(s), fewer than its "
                                 f"{named} subscripts")
            ellipsis_rank = max(ellipsis_rank, t.ndim - named)
        elif t.ndim != named:
            raise ValueError(f"einsum(): operand {term!r} names {named} dimension(s), the tensor has "
                             f"{t.ndim} (shape {tuple(t.shape)})")
    dots = "".join(free[:ellipsis_rank])
    subs = [term.replace("...", dots[ellipsis_rank - (t.ndim - len(term.replace('...', ''))):])
            for term, t in zip(terms, operands)]
    if arrow:
        if "..." not in out and ellipsis_rank and any("..." in term for term in terms):
            raise ValueError(f"einsum(): {equation!r} has '...' on the left but not in the output")
        out = out.replace("...", dots)
        for c in out:
            if out.count(c) > 1 or not any(c in s for s in subs):
                raise ValueError(f"einsum(): output subscript {c!r} in {equation!r} appears more than once "
                                 "or in no operand")
    else:  # implicit: the broadcast letters, then the letters that appear once, in order
        counts = {}
        for s in subs:
            for c in s:
                counts[c] = counts.get(c, 0) + 1
        out = dots + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in dots))
    for s, t in zip(subs, operands):
        if len(set(s)) != len(s):
            raise NotImplementedError(f"einsum(): a subscript repeated within one operand ({s!r}: a "
                                      "diagonal) is not supported; take torch.diagonal's equivalent first")
    return subs, out


def _sizes(subs, operands) -> dict:
    size = {}
    for s, t in zip(subs, operands):
        for c, n in zip(s, t.shape):
            if size.get(c, 1) != 1 and n != 1 and size[c] != n:
                raise ValueError(f"einsum(): subscript {c!r} has size {size[c]} in one operand and {n} in another")
            size[c] = max(size.get(c, 1), n)
    return size


def _sum_away(t, s: str, keep: set) -> tuple:
    dims = [i for i, c in enumerate(s) if c not in keep]
    if dims:
        t = t.sum(dim=dims)
        s = "".join(c for c in s if c in keep)
    return t, s


def _contract(a, sa: str, b, sb: str, keep: set, size: dict) -> tuple:
    batch = [c for c in sa if c in sb and c in keep]
    summed = [c for c in sa if c in sb and c not in keep]
    left = [c for c in sa if c not in sb]
    right = [c for c in sb if c not in sa]

    def arrange(t, s, order):
        t = t.permute(*[s.index(c) for c in order]) if list(s) != order else t
        want = [size[c] for c in order]
        return t.expand(*want) if list(t.shape) != want else t  # broadcast letters of size 1

    def prod(cs):
        n = 1
        for c in cs:
            n *= size[c]
        return n
    a = arrange(a, sa, batch + left + summed).reshape(prod(batch), prod(left), prod(summed))
    b = arrange(b, sb, batch + summed + right).reshape(prod(batch), prod(summed), prod(right))
    out = matmul(a, b).reshape(*[size[c] for c in batch + left + right])
    return out, "".join(batch + left + right)


def einsum(equation: str, *operands):
    """torch.einsum(equation, *operands) (operands may also be given as one list)."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not operands:
        raise ValueError("einsum(): at least one operand is needed")
    subs, out = _parse(equation, operands)
    size = _sizes(subs, operands)
    tensors = list(operands)
    for k in range(len(tensors)):  # letters no other operand and not the output needs: summed first
        others = set(out).union(*(set(s) for j, s in enumerate(subs) if j != k))
        tensors[k], subs[k] = _sum_away(tensors[k], subs[k], others)
    acc, s_acc = tensors[0], subs[0]
    for k in range(1, len(tensors)):
        keep = set(out).union(*(set(s) for s in subs[k + 1:]))
        acc, s_acc = _contract(acc, s_acc, tensors[k], subs[k], keep, size)
    acc, s_acc = _sum_away(acc, s_acc, set(out))
    want = [size[c] for c in out]
    if s_acc != out:
        acc = acc.permute(*[s_acc.index(c) for c in out])
    return acc.expand(*want) if list(acc.shape) != want else acc
