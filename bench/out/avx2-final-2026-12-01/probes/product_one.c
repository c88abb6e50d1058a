/* One Q4 product in FAST precision (AVX2 without AVX-VNNI), interleaved, hot:
 * product_one ROWS COLS REPS [N]; best of 5 rounds of REPS calls. */
#define _GNU_SOURCE
#include <omp.h>
#include "probe_wmat.h"
int main(int argc,char**argv){
  int rows=atoi(argv[1]), cols=atoi(argv[2]), reps=atoi(argv[3]); int n=argc>4?atoi(argv[4]):1;
  hkv_cpu_kernels t; hkv_cpu_kernels_init(&t,257); hkv_cpu_kernels_set_precision(&t,HKV_PREC_FAST);
  hkv_wmat w=mk(HKV_W_Q4,rows,cols,t.qgemm_pack);
  float *x=xa(4*cols*n), *y=xa(4*rows*n), *ws=xa(4*hkv_matmul_ws_floats(&w)+4096);
  double best=1e9;
  for(int k=0;k<5;k++){ double t0=now(); for(int r=0;r<reps;r++) hkv_matmul(&t,&w,x,n,y,ws); double dt=(now()-t0)/reps; if(dt<best)best=dt;}
  printf("%dx%d Q4 n=%d, %d threads: %.2f us/call, %.1f GB/s %.0f GOP/s\n",rows,cols,n,omp_get_max_threads(),best*1e6,hkv_wmat_bytes(&w)/best/1e9,2.0*rows*cols*n/best/1e9);
}
