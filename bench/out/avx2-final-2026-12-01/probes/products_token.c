/* One decode token's FAST weight products at SmolLM2-135M's shapes (30 layers of
 * QKV 960x576, O 576x576, gate|up 2x1536x576, down 576x1536 in Q4, then the
 * 49152x576 Q8 head), interleaved as the engine packs them, n = 1, through
 * hkv_matmul_parts / hkv_matmul as runtime/backend_cpu.c calls them.
 * Usage: products_token ISA REPS (ISA 257: AVX2 without AVX-VNNI).
 * -DHOT=1: one layer's matrices 30 times and no head (L2/L3: the kernels'
 * compute rate; the MB printed are still the cold set's, so scale by 66.4/96.4). */
#define _GNU_SOURCE
#ifndef HOT
#define HOT 0
#endif
#include <omp.h>
#include "probe_wmat.h"
int main(int argc,char**argv){
  int isa = argc>1? atoi(argv[1]) : (HKV_ISA_AVX2|HKV_ISA_NO_AVXVNNI);
  int reps = argc>2? atoi(argv[2]):200;
  hkv_cpu_kernels t; hkv_cpu_kernels_init(&t,isa); hkv_cpu_kernels_set_precision(&t,HKV_PREC_FAST);
  int g=t.qgemm_pack; int L=30;
  hkv_wmat qkv[30][3], o[30], gu[30][2], dn[30], head;
  size_t bytes=0;
  for(int l=0;l<L;l++){ qkv[l][0]=mk(HKV_W_Q4,576,576,g); qkv[l][1]=mk(HKV_W_Q4,192,576,g); qkv[l][2]=mk(HKV_W_Q4,192,576,g);
    o[l]=mk(HKV_W_Q4,576,576,g); gu[l][0]=mk(HKV_W_Q4,1536,576,g); gu[l][1]=mk(HKV_W_Q4,1536,576,g); dn[l]=mk(HKV_W_Q4,576,1536,g);
    bytes += hkv_wmat_bytes(&qkv[l][0])+hkv_wmat_bytes(&qkv[l][1])+hkv_wmat_bytes(&qkv[l][2])+hkv_wmat_bytes(&o[l])+hkv_wmat_bytes(&gu[l][0])+hkv_wmat_bytes(&gu[l][1])+hkv_wmat_bytes(&dn[l]); }
  head=mk(HKV_W_Q8,49152,576,g); bytes+=hkv_wmat_bytes(&head);
  float *x=xa(4*2000), *y=xa(4*60000), *ws=xa(4*hkv_matmul_ws_floats(&head)*4+4096);
  for(int i=0;i<1536;i++) x[i]=(i%7)-3;
  double best=1e9, sum=0, hb=1e9;
  for(int r=0;r<reps;r++){
    double t0=now();
    for(int l0=0;l0<L;l0++){ int l=HOT?0:l0; hkv_matmul_parts(&t,qkv[l],3,x,1,y,960,ws,NULL); hkv_matmul(&t,&o[l],x,1,y,ws);
      hkv_matmul_parts(&t,gu[l],2,x,1,y,3072,ws,NULL); hkv_matmul(&t,&dn[l],x+0,1,y,ws);}
    double t1=now(); if(!HOT) hkv_matmul(&t,&head,x,1,y,ws); double t2=now();
    if(t2-t0<best) best=t2-t0; if(t2-t1<hb) hb=t2-t1; sum+=t2-t0;
  }
  double pb = hkv_bandwidth_probe(1u<<30, 4);
  printf("token products: %.1f MB, best %.3f ms (%.1f GB/s), mean %.3f ms (%.1f GB/s); head best %.3f ms (%.1f GB/s); probe %.1f GB/s\n",
    bytes/1e6, best*1e3, bytes/best/1e9, sum/reps*1e3, bytes/(sum/reps)/1e9, hb*1e3, hkv_wmat_bytes(&head)/hb/1e9, pb/1e9);
  return 0;
}
