#!/usr/bin/env python3
"""Write a C++ unit that includes a .cu file by absolute path, so the host
compiler builds the .cu source unchanged and diagnostics name the real file."""
import os
import sys

src, out = sys.argv[1], sys.argv[2]
with open(out, "w") as f:
    f.write('#include "%s"\n' % os.path.abspath(src))
