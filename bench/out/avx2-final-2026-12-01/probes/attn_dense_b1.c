/* Batch-1 decode attention as the tiered cache runs `full` in place:
 * attn_dense over pieces of PIECE rows of each of 3 KV heads (g 3, d 64),
 * the pieces of a layer spread over the threads, layer after layer over L
 * layers' own rows (L 150 at 1024 rows: 94 MB, past the L3).
 * Usage: attn_dense_b1 ROWS REPS PIECE L. */
#define _GNU_SOURCE
#include <omp.h>
#include "probe_wmat.h"
int main(int argc,char**argv){
  int n=argc>1?atoi(argv[1]):1024, L=argc>4?atoi(argv[4]):30, KH=3, g=3, d=64, reps=argc>2?atoi(argv[2]):200, piece=argc>3?atoi(argv[3]):512;
  hkv_cpu_kernels t; hkv_cpu_kernels_init(&t,257);
  size_t per=(size_t)n*d; uint16_t *K=aligned_alloc(64,2*per*L*KH), *V=aligned_alloc(64,2*per*L*KH);
  for(size_t i=0;i<per*L*KH;i++){K[i]=0x3000+(i%97);V[i]=0x3000+(i%89);}
  float q[3*64]; for(int i=0;i<192;i++) q[i]=0.01f*(i%13);
  int np=(n+piece-1)/piece; double best=1e9,sum=0;
  for(int r=0;r<reps;r++){ double t0=now();
    for(int l=0;l<L;l++){
#pragma omp parallel for schedule(dynamic,1)
      for(int u=0;u<KH*np;u++){ int h=u/np, p=u%np; int64_t a=(int64_t)p*piece, b=a+piece<n?a+piece:n;
        float o[3*64], ls[3]; size_t off=((size_t)l*KH+h)*per + a*d;
        t.attn_dense(q,g,d,K+off,V+off,d,b-a,0.125f,o,ls); }
    }
    double dt=now()-t0; if(dt<best)best=dt; sum+=dt; }
  double bytes=4.0*per*L*KH;
  printf("n %d piece %d: best %.3f ms (%.1f GB/s) mean %.3f ms (%.1f GB/s)\n",n,piece,best*1e3,bytes/best/1e9,sum/reps*1e3,bytes/(sum/reps)/1e9);
}
