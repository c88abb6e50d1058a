/* one-thread microbench of the AVX2 qgemm: base (from /work/h38-base-src) vs new (worktree) */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <stdint.h>
#include "kernels.h"
#include "kernels_impl.h"
void hkv_qgemm_QB(const hkv_wmat *m, const hkv_qact *a, int n, float *y, int64_t ldy, int64_t r0, int64_t r1);
static double now(void){struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t); return t.tv_sec+1e-9*t.tv_nsec;}
int main(int argc,char**argv){
  int rows=atoi(argv[1]), cols=atoi(argv[2]), n=atoi(argv[3]); int q4 = argc>4 ? atoi(argv[4]) : 1;
  hkv_wmat m={q4?HKV_W_Q4:HKV_W_Q8,rows,cols,0,0,0};
  size_t qb = q4? (size_t)rows*cols/2 : (size_t)rows*cols;
  m.q=aligned_alloc(64,(qb+63)/64*64); int64_t nb=cols/32;
  m.scale=malloc(rows*nb*2); m.min=malloc(rows*nb*2);
  srand(1); for(size_t i=0;i<qb;i++) ((uint8_t*)m.q)[i]=rand();
  for(int64_t i=0;i<rows*nb;i++){ m.scale[i]=0x2000+(rand()&0x3ff); m.min[i]=0xa000+(rand()&0x3ff);} 
  float *x=malloc(sizeof(float)*n*cols); for(size_t i=0;i<(size_t)n*cols;i++) x[i]=(rand()%2001-1000)/1000.0f;
  void *buf=aligned_alloc(64,(hkv_qact_bytes(cols,n)+63)/64*64); hkv_qact a; hkv_qact_view(&a,buf,cols,n);
  hkv_quant_act_avx2(x,0,n,&a);
  float *y=malloc(sizeof(float)*n*rows);
  double best=1e9; for(int rep=0;rep<7;rep++){ int it=0; double t0=now(), t;
    do { hkv_qgemm_QB(&m,&a,n,y,rows,0,rows); it++; t=now(); } while(t-t0<0.15);
    double us=(t-t0)/it*1e6; if(us<best)best=us; }
  double ck=0; for(size_t i=0;i<(size_t)n*rows;i++) ck+=y[i]*(1+i%7);
  printf("%s %dx%d n=%d: %.1f us  %.1f GOP/s  ck=%.6g\n", q4?"q4":"q8", rows, cols, n, best, 2.0*rows*cols*n/best/1e3, ck);
}
