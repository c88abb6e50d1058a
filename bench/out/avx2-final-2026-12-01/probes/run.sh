#!/usr/bin/env bash
# The probes behind bench/out/avx2-final-2026-12-01/README.md, against the
# static libraries of a release build (default build-emu). Run from the
# repository root: bash bench/out/avx2-final-2026-12-01/probes/run.sh [BUILD]
set -euo pipefail
B=${1:-build-emu}
P=bench/out/avx2-final-2026-12-01/probes
T=$(mktemp -d)
inc="-Icpu -Ibase -I$P"
libs="-Wl,--start-group $B/cpu/*.a $B/runtime/libhkv.a -Wl,--end-group -ldnnl -lm"
# the AVX2 products as built, and once without the Q4 min's FMA (a wrong
# result, only to see whether that dependency chain bounds the kernel)
gcc -O3 -mavx2 -mfma -mf16c -fopenmp $inc -c cpu/qgemm_avx2.c -o $T/q.o
mkdir -p $T/nomin && cp cpu/qgemm_avx2.c cpu/qgemm_avx2.inc $T/nomin/
sed -i 's/if (q4) acc\[t\] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a->sx\[so\]), acc\[t\]);/(void)mw;/' $T/nomin/qgemm_avx2.inc
gcc -O3 -mavx2 -mfma -mf16c -fopenmp -I$T/nomin $inc -c $T/nomin/qgemm_avx2.c -o $T/qn.o
for s in products_token product_one; do
    gcc -O2 -fopenmp $inc $P/$s.c $T/q.o -o $T/$s $libs
done
gcc -O2 -fopenmp $inc -DHOT=1 $P/products_token.c $T/q.o -o $T/products_hot $libs
gcc -O2 -fopenmp $inc $P/product_one.c $T/qn.o -o $T/product_one_nomin $libs
gcc -O2 -fopenmp $inc $P/attn_dense_b1.c -o $T/attn_dense_b1 $libs
# and with the attention kernels' prefetch distance (cpu/attn_simd.inc PF_BLOCKS) moved
for pf in 8 16; do
    gcc -O3 -mavx2 -mfma -mf16c -fopenmp $inc -DPF_BLOCKS=$pf -c cpu/attn_avx2.c -o $T/a$pf.o
    gcc -O2 -fopenmp $inc $P/attn_dense_b1.c $T/a$pf.o -o $T/attn_dense_b1_pf$pf $libs
done
gcc -O2 -fopenmp $P/region_vs_barrier.c -o $T/region_vs_barrier
export OMP_PROC_BIND=close
isa=257   # HKV_ISA_AVX2 | HKV_ISA_NO_AVXVNNI
echo "== one token's FAST products (SmolLM2's 30 layers + head), cold (DRAM) then hot (one layer's matrices 30 times, head skipped)"
for th in 1 2; do for r in 1 2; do OMP_NUM_THREADS=$th $T/products_token $isa 300; OMP_NUM_THREADS=$th $T/products_hot $isa 300; done; done
echo "== one product, n = 1 (and 64), in L2; nomin: without the Q4 min's FMA"
for s in "576 576" "1536 576" "576 1536" "4608 576"; do for th in 1 2; do OMP_NUM_THREADS=$th $T/product_one $s 20000; done; done
for s in "1536 576" "576 1536"; do OMP_NUM_THREADS=1 $T/product_one $s 20000; OMP_NUM_THREADS=1 $T/product_one_nomin $s 20000; done
for s in "1536 576" "576 1536"; do for th in 1 2; do OMP_NUM_THREADS=$th $T/product_one $s 300 64; done; done
echo "== an empty OpenMP region against a barrier in a held region"
for r in 1 2 3; do OMP_NUM_THREADS=2 $T/region_vs_barrier; done
echo "== batch-1 decode attention, d 64 g 3, 3 KV heads x 1024 rows, pieces of 512, 150 layers' rows (94 MB: DRAM)"
for r in 1 2; do for v in "" _pf8 _pf16; do echo -n "PF_BLOCKS ${v:-_pf4}: "; OMP_NUM_THREADS=2 $T/attn_dense_b1$v 1024 50 512 150; done; done
rm -rf "$T"
