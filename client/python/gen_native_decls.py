#!/usr/bin/python3
"""Generates hgemm/_native_decls.py, the ctypes declarations of the C ABI, from client/c/hgemm.h.

The native core (hgemm/_native.py) calls libhgemm_client.so through ctypes, which knows nothing
of the header: every function's restype and argtypes, every struct's fields and the constants
must be spelled out in Python. Written by hand they drift from the header unseen (a wrong
argument type is a crash or a silently truncated value, not an error), so they are generated
from it and committed, and `--check` (run by the tests) fails when the header changed since.

The parser is a small one for the header's own regular style, not a C compiler's: comments,
`#include <stddef.h>` / `<stdint.h>`, the include guard, `#ifdef __cplusplus` blocks (skipped),
the HGEMM_EXPORT macro, `#define NAME <integer>`, anonymous `enum { NAME = <integer>, ... }`,
`typedef struct X X` (opaque), `typedef struct X { fields } X`, `typedef R (*name)(params)`
(callbacks) and `HGEMM_EXPORT R name(params)`. Anything else stops it with the line it could
not read, so that nothing in the header is left out of the bindings unnoticed.

How C types become ctypes (as the native core uses them):
  - opaque handles (hgemm_client_t*, ...) and void*: c_void_p (the core keeps them as ints);
  - const char*: c_char_p (strings passed in, and strings the library keeps, read as bytes);
  - char* (returned: a malloc()ed string the caller frees) and char** (errptr, a kept C's
    handle: one filled in): c_void_p / POINTER(c_void_p), so that the core has the address to
    hgemm_free(); c_char_p would copy the bytes and lose it;
  - const char** and const char* const*: POINTER(c_char_p);
  - a struct pointer: POINTER(the Structure); a scalar pointer: POINTER(the scalar);
  - a callback typedef: the CFUNCTYPE of that name.

    client/python/gen_native_decls.py           rewrite hgemm/_native_decls.py
    client/python/gen_native_decls.py --check   exit 1 if it differs from a fresh one (CI)
"""
import argparse
import difflib
import pathlib
import re
import sys
from typing import List, NamedTuple, Optional, Tuple

HERE = pathlib.Path(__file__).resolve().parent
HEADER = HERE.parent / "c" / "hgemm.h"
OUT = HERE / "hgemm" / "_native_decls.py"
EXPORT = "HGEMM_EXPORT"

# C scalar types → ctypes names. "char" only as an array element (char name[N]).
SCALARS = {
    "char": "c_char", "signed char": "c_byte", "unsigned char": "c_ubyte",
    "short": "c_short", "unsigned short": "c_ushort", "int": "c_int", "unsigned": "c_uint",
    "unsigned int": "c_uint", "long": "c_long", "unsigned long": "c_ulong",
    "long long": "c_longlong", "unsigned long long": "c_ulonglong",
    "float": "c_float", "double": "c_double", "size_t": "c_size_t",
    "int8_t": "c_int8", "uint8_t": "c_uint8", "int16_t": "c_int16", "uint16_t": "c_uint16",
    "int32_t": "c_int32", "uint32_t": "c_uint32", "int64_t": "c_int64", "uint64_t": "c_uint64",
}
INCLUDES = {"<stddef.h>", "<stdint.h>"}
# The conditions the header's #if blocks test, and whether a C compiler's view takes them.
CONDITIONS = {"#ifdef __cplusplus": False, "#if defined(__GNUC__)": True}


class HeaderError(Exception):
    """A declaration the generator cannot read: its line, and why."""

    def __init__(self, line: int, why: str, text: str = ""):
        snippet = " ".join(text.split())
        super().__init__(f"line {line}: {why}" + (f": {snippet[:160]}" if snippet else ""))


class CType(NamedTuple):
    base: str           # "unsigned char", "hgemm_gemm_info_t", ...
    const: bool         # the base is const
    pointers: Tuple[bool, ...]  # one per '*', outermost last: whether that pointer is const


class Decls:
    """What the header declares, in its order."""

    def __init__(self):
        self.constants: List[Tuple[int, str, int]] = []  # (line, name, value)
        self.opaque: List[str] = []
        self.structs: List[Tuple[str, List[Tuple[str, str]]]] = []  # (name, [(field, type)])
        self.callbacks: List[Tuple[str, str, List[str]]] = []  # (name, restype, argtypes)
        self.functions: List[Tuple[str, str, List[str]]] = []


def strip_comments(text: str) -> str:
    """text without /* */ and // comments, each replaced by its newlines (lines keep numbers)."""
    def blank(m: re.Match) -> str:
        return "\n" * m.group(0).count("\n") or " "
    return re.sub(r"/\*.*?\*/|//[^\n]*", blank, text, flags=re.S)


def preprocess(text: str, decls: Decls) -> List[Tuple[int, str]]:
    """The lines a C compiler reads (numbered from 1), directives taken out; integer #defines
    go into decls.constants."""
    out, active = [], [True]  # one entry per open #if: whether its lines are read
    guard: Optional[str] = None
    for number, line in enumerate(text.split("\n"), 1):
        s = line.strip()
        if not s.startswith("#"):
            out.append((number, line if all(active) else ""))
            continue
        directive = " ".join(s.split())
        if directive in CONDITIONS:
            active.append(CONDITIONS[directive])
        elif directive.startswith("#ifndef ") and guard is None:
            guard = directive.split()[1]
            active.append(True)
        elif directive == "#else" and len(active) > 1:
            active[-1] = not active[-1]
        elif directive == "#endif" and len(active) > 1:
            active.pop()
        elif not all(active):
            pass  # a directive in a block a C compiler skips (the other HGEMM_EXPORT)
        elif directive.startswith("#include ") and directive.split(None, 1)[1] in INCLUDES:
            pass
        elif directive == f"#define {guard}":
            pass
        elif directive.startswith(f"#define {EXPORT} "):
            pass  # an attribute; the declarations' HGEMM_EXPORT is matched by parse()
        elif re.fullmatch(r"#define [A-Z][A-Z0-9_]* -?\d+", directive):
            _, name, value = directive.split()
            decls.constants.append((number, name, int(value)))
        else:
            raise HeaderError(number, "unsupported preprocessor directive", directive)
        out.append((number, ""))
    if len(active) != 1:
        raise HeaderError(len(out), "an #if block is not closed")
    return out


def statements(lines: List[Tuple[int, str]]) -> List[Tuple[int, str]]:
    """The top-level declarations (each up to its ';', braces matched), with their first line."""
    result, current, start, depth = [], [], None, 0
    for number, line in lines:
        for ch in line + "\n":
            if start is None and not ch.isspace():
                start = number
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth < 0:
                    raise HeaderError(number, "unmatched '}'")
            if ch == ";" and depth == 0:
                result.append((start, " ".join("".join(current).split())))
                current, start = [], None
            else:
                current.append(ch)
    if "".join(current).strip():
        raise HeaderError(start or 0, "a declaration does not end with ';'", "".join(current))
    return result


IDENT = r"[A-Za-z_]\w*"


def parse_type(tokens: List[str], line: int, text: str) -> CType:
    """A type from its tokens (identifiers and '*'): `const char* const*` and the like."""
    base, const, pointers = [], False, []
    for tok in tokens:
        if tok == "*":
            pointers.append(False)
        elif tok == "const":
            if pointers:
                pointers[-1] = True
            else:
                const = True
        elif pointers or not re.fullmatch(IDENT, tok):
            raise HeaderError(line, f"cannot read the type ({tok!r})", text)
        else:
            base.append(tok)
    if not base:
        raise HeaderError(line, "a declaration without a type", text)
    return CType(" ".join(base), const, tuple(pointers))


def split_declarator(text: str, line: int) -> Tuple[CType, str, Optional[int]]:
    """`type name` or `type name[N]` → (type, name, N or None)."""
    tokens = re.findall(r"[A-Za-z_]\w*|\*|\[\s*\d+\s*\]|\S", text)
    length = None
    if tokens and tokens[-1].startswith("["):
        length = int(tokens.pop()[1:-1])
    if len(tokens) < 2 or not re.fullmatch(IDENT, tokens[-1]) or tokens[-1] in (
            "const", *{w for t in SCALARS for w in t.split()}):
        raise HeaderError(line, "expected a type and a name", text)
    return parse_type(tokens[:-1], line, text), tokens[-1], length


class Mapper:
    """C types → the ctypes expressions of the generated module."""

    def __init__(self, decls: Decls):
        self.decls = decls

    def __call__(self, t: CType, line: int, text: str, *, ret: bool = False) -> str:
        opaque = set(self.decls.opaque)
        structs = {name for name, _ in self.decls.structs}
        callbacks = {name for name, _, _ in self.decls.callbacks}
        depth = len(t.pointers)
        if depth == 0:
            if t.base == "void" and ret:
                return "None"
            if t.base in SCALARS and t.base != "char":
                return SCALARS[t.base]
            if t.base in callbacks:
                return t.base
            raise HeaderError(line, f"cannot pass {t.base!r} by value", text)
        if depth == 1:
            if t.base == "char":
                # const char*: a string in, or one the library keeps; char*: a malloc()ed one
                # the caller frees, kept as its address.
                return "c_char_p" if t.const else "c_void_p"
            if t.base == "void" or t.base in opaque:
                return "c_void_p"
            if t.base in structs or t.base in SCALARS:
                return f"POINTER({SCALARS.get(t.base, t.base)})"
        if depth == 2 and t.base == "char":
            return "POINTER(c_char_p)" if t.const else "POINTER(c_void_p)"
        raise HeaderError(line, f"no ctypes mapping for {t.base}{'*' * depth}", text)


def parse_params(params: str, line: int, text: str, mapper: Mapper) -> List[str]:
    params = params.strip()
    if params == "void":
        return []
    if not params:
        raise HeaderError(line, "an empty parameter list (write (void))", text)
    result = []
    for param in params.split(","):
        t, _, length = split_declarator(param, line)
        if length is not None:
            raise HeaderError(line, "an array parameter (write a pointer)", text)
        result.append(mapper(t, line, text))
    return result


def parse_struct(name: str, body: str, line: int, text: str,
                 mapper: Mapper) -> List[Tuple[str, str]]:
    """The fields of struct `name` (body: what its braces hold), as (name, ctypes type)."""
    fields = []
    for member in body.split(";"):
        if not member.strip():
            continue
        first, *more = member.split(",")
        t, field, length = split_declarator(first, line)
        names = [(field, length)]
        for extra in more:  # uint32_t m, n, k
            m = re.fullmatch(rf"\s*({IDENT})\s*(?:\[\s*(\d+)\s*\])?\s*", extra)
            if not m:
                raise HeaderError(line, f"cannot read a field of {name}", member)
            names.append((m.group(1), int(m.group(2)) if m.group(2) else None))
        for field, length in names:
            if length is not None:
                if t.pointers or t.base not in SCALARS:
                    raise HeaderError(line, f"an array of {t.base} in {name}", member)
                fields.append((field, f"{SCALARS[t.base]} * {length}"))
            else:
                if t.base == "char" and not t.pointers:
                    raise HeaderError(line, f"a lone char in {name}", member)
                fields.append((field, mapper(t, line, member)))
    if not fields:
        raise HeaderError(line, f"struct {name} has no fields", text)
    return fields


def parse(text: str) -> Decls:
    decls = Decls()
    mapper = Mapper(decls)
    for line, stmt in statements(preprocess(strip_comments(text), decls)):
        m = re.fullmatch(r"enum \{(.*)\}", stmt)
        if m:
            for member in m.group(1).split(","):
                e = re.fullmatch(rf"\s*({IDENT})\s*=\s*(-?\d+)\s*", member)
                if not e:
                    raise HeaderError(line, "an enum member that is not NAME = <integer>", stmt)
                decls.constants.append((line, e.group(1), int(e.group(2))))
            continue
        m = re.fullmatch(rf"typedef struct ({IDENT}) ({IDENT})", stmt)
        if m and m.group(1) == m.group(2):
            decls.opaque.append(m.group(1))
            continue
        m = re.fullmatch(rf"typedef struct ({IDENT}) \{{(.*)\}} ({IDENT})", stmt)
        if m and m.group(1) == m.group(3):
            decls.structs.append((m.group(1), parse_struct(m.group(1), m.group(2), line, stmt,
                                                           mapper)))
            continue
        m = re.fullmatch(rf"typedef (.+?)\(\s*\*\s*({IDENT})\s*\)\s*\((.*)\)", stmt)
        if m:
            restype = mapper(parse_type(re.findall(r"\w+|\*|\S", m.group(1)), line, stmt), line,
                             stmt, ret=True)
            decls.callbacks.append((m.group(2), restype,
                                    parse_params(m.group(3), line, stmt, mapper)))
            continue
        m = re.fullmatch(rf"{EXPORT} (.+?)\b({IDENT})\s*\(([^()]*)\)", stmt)
        if m:
            t = parse_type(re.findall(r"\w+|\*|\S", m.group(1)), line, stmt)
            decls.functions.append((m.group(2), mapper(t, line, stmt, ret=True),
                                    parse_params(m.group(3), line, stmt, mapper)))
            continue
        raise HeaderError(line, "not a declaration this generator reads", stmt)
    decls.constants.sort(key=lambda c: c[0])  # stable: an enum's members keep their order
    names = [n for _, n, _ in decls.constants] + decls.opaque + [s for s, _ in decls.structs] + [
        c for c, _, _ in decls.callbacks] + [f for f, _, _ in decls.functions]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise HeaderError(0, f"declared twice: {', '.join(twice)}")
    if not decls.functions:
        raise HeaderError(0, f"no {EXPORT} function found")
    return decls


def wrap(head: str, items: List[str], tail: str, indent: str) -> List[str]:
    """head + items joined by ", " + tail, broken into lines of at most 100 characters."""
    lines, current = [], head
    for i, item in enumerate(items):
        piece = item + (", " if i < len(items) - 1 else tail)
        if len(current) + len(piece.rstrip()) > 100 and current.strip():
            lines.append(current.rstrip())
            current = indent
        current += piece
    if not items:
        current += tail
    lines.append(current.rstrip())
    return lines


def render(decls: Decls, header_name: str) -> str:
    used = set()
    for text in ([t for _, fields in decls.structs for _, t in fields] +
                 [r for _, r, _ in decls.callbacks + decls.functions] +
                 [a for _, _, args in decls.callbacks + decls.functions for a in args]):
        used.update(re.findall(r"\b(?:c_\w+|POINTER)\b", text))
    if decls.structs:
        used.add("Structure")
    if decls.callbacks:
        used.add("CFUNCTYPE")
    out = [f'"""Generated from {header_name} by client/python/gen_native_decls.py: do not edit.',
           "",
           "The C ABI as ctypes sees it: the header's integer constants, its structs, its callback",
           "types and every function's (restype, argtypes) in FUNCTIONS; declare(lib) sets them",
           "on a loaded library. After changing the header, run gen_native_decls.py and commit",
           "this file (the tests run `gen_native_decls.py --check`).",
           '"""']
    out += wrap("from ctypes import (", sorted(used, key=str.lower), ")", "                    ")
    out += ["", "# #define and enum constants, in the header's order."]
    out += [f"{name} = {value}" for _, name, value in decls.constants]
    for name, fields in decls.structs:
        out += ["", "", f"class {name}(Structure):", "    _fields_ = ["]
        out += [f'        ("{field}", {t}),' for field, t in fields]
        out += ["    ]"]
    out += ["", "", "# Callback types (typedef R (*name)(...))."]
    for name, restype, args in decls.callbacks:
        out += wrap(f"{name} = CFUNCTYPE(", [restype] + args, ")", " " * (len(name) + 13))
    out += ["", "# name: (restype, argtypes), in the header's order; opaque handles are c_void_p.",
            "FUNCTIONS = {"]
    for name, restype, args in decls.functions:
        head = f'    "{name}": ({restype}, ('
        out += wrap(head, args, ",))," if len(args) == 1 else ")),", " " * 8)
    out += ["}",
            "",
            "",
            "def declare(lib):",
            '    """lib (a ctypes.CDLL of libhgemm_client) with every function of FUNCTIONS',
            "    declared; AttributeError names the first one it lacks.\"\"\"",
            "    for name, (restype, argtypes) in FUNCTIONS.items():",
            "        fn = getattr(lib, name)",
            "        fn.restype, fn.argtypes = restype, argtypes",
            "    return lib",
            ""]
    return "\n".join(out)


def generate(header: pathlib.Path) -> str:
    try:
        decls = parse(header.read_text())
    except HeaderError as e:
        raise SystemExit(f"gen_native_decls: {header}: {e}")
    return render(decls, "client/c/hgemm.h")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with the committed module instead of writing it")
    parser.add_argument("--header", type=pathlib.Path, default=HEADER,
                        help=f"the C header (default {HEADER})")
    parser.add_argument("--out", type=pathlib.Path, default=OUT,
                        help=f"the generated module (default {OUT})")
    args = parser.parse_args()
    text = generate(args.header)
    if args.check:
        old = args.out.read_text() if args.out.exists() else ""
        if old != text:
            diff = difflib.unified_diff(old.splitlines(), text.splitlines(), str(args.out),
                                        "fresh", lineterm="", n=1)
            print("\n".join(list(diff)[:40]), file=sys.stderr)
            print(f"gen_native_decls: {args.out.name} differs from {args.header.name}; "
                  "run client/python/gen_native_decls.py and commit", file=sys.stderr)
            return 1
        print(f"gen_native_decls: {args.out.name} matches {args.header.name}")
        return 0
    args.out.write_text(text)
    print(f"gen_native_decls: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
