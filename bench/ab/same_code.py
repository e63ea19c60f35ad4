#!/usr/bin/env python3
"""Which functions of two object files are the same machine code (instruction for instruction,
branch targets and relocations ignored): for kernel refactors that should not change the code.

  bench/ab/same_code.py OLD.o NEW.o REGEX

Functions are matched by demangled name with the parameter lists dropped and GgmlType template
arguments written as their numbers, so a kernel that moved between files or took a struct instead of
bytes still pairs up. Example (the packed kernels of issue 15, old build in /tmp/old-build):
  bench/ab/same_code.py /tmp/old-build/simd/CMakeFiles/towers_simd.dir/quant_dot.cc.o \\
      build/simd/CMakeFiles/towers_simd.dir/gemm_packed.cc.o 'N_(AVX2|AVX3|AVX3_DL)::PackedGroup<'
"""
import re
import subprocess
import sys


def functions(obj, pattern):
    out = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", "-M", "intel", obj],
                         capture_output=True, text=True, check=True).stdout
    funcs, name = {}, None
    for line in out.split("\n"):
        m = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if m:
            name = re.sub(r"\(towers::simd::GgmlType\)(\d+)", r"\1u", m.group(1))
            name = re.sub(r">\(.*\)", ">", name)
            funcs[name] = [] if re.search(pattern, name) else None
            continue
        if name and funcs.get(name) is not None and "\t" in line:
            ins = line.split("\t", 1)[1].strip()
            ins = re.sub(r"\b[0-9a-f]+ <.*>$", "TARGET", ins)
            funcs[name].append(re.sub(r"#.*", "", ins).strip())
    return {k: v for k, v in funcs.items() if v is not None}


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    old, new = functions(sys.argv[1], sys.argv[3]), functions(sys.argv[2], sys.argv[3])
    same = [k for k in old if k in new and old[k] == new[k]]
    for k in sorted(old):
        if k not in new:
            print("only in old:", k)
        elif old[k] != new[k]:
            print(f"different: {k} ({len(old[k])} -> {len(new[k])} instructions)")
    for k in sorted(set(new) - set(old)):
        print("only in new:", k)
    print(f"{len(same)} of {len(old)} functions the same machine code ({len(new)} in new)")


if __name__ == "__main__":
    main()
