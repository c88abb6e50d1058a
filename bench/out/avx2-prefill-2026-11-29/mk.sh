#!/bin/bash
# mk.sh NAME INC : build /tmp/h38/qb_NAME from a qgemm .inc
set -e
EXTRA=""; [ "${3:-0}" = 1 ] && EXTRA=-mavxvnni
W=/work/wt-h38
printf '#define QG2_VNNI %s\n#define QG2_SFX QB\n#include "%s"\n' "${3:-0}" "$2" > /tmp/h38/k_$1.c
gcc -O3 -std=c11 -D_GNU_SOURCE -fno-strict-aliasing -fPIC -DNDEBUG -mavx2 -mfma -mf16c $EXTRA -I$W/cpu -I$W/include -I$W -c /tmp/h38/k_$1.c -o /tmp/h38/k_$1.o
gcc -O2 -std=gnu11 -mavx2 -mfma -mf16c -I$W/cpu -I$W/include -I$W /tmp/h38/qb.c /tmp/h38/k_$1.o $W/build-h38/cpu/libhkv_cpu_avx2.a $W/build-h38/runtime/libhkv.a -lm -fopenmp -o /tmp/h38/qb_$1
