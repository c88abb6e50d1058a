/* What the product probes share: a clock, aligned filled buffers, and a
 * Q4/Q8 matrix of constant scales interleaved for the FAST products. */
#ifndef PROBE_WMAT_H
#define PROBE_WMAT_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "kernels.h"
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
static void *xa(size_t n){void*p=NULL;if(posix_memalign(&p,64,(n+63)&~63ul)){fprintf(stderr,"no memory\n");exit(1);}memset(p,1,n);return p;}
static hkv_wmat mk(int type,int64_t rows,int64_t cols,int g){
  hkv_wmat w={.type=type,.rows=rows,.cols=cols};
  size_t qb = type==HKV_W_Q4? rows*cols/2 : rows*cols; int64_t nb=cols/32;
  w.q=xa(qb); w.scale=xa(2*rows*nb); if(type==HKV_W_Q4) w.min=xa(2*rows*nb);
  uint16_t *s=w.scale; for(int64_t i=0;i<rows*nb;i++) s[i]=0x2000; if(w.min){s=w.min;for(int64_t i=0;i<rows*nb;i++) s[i]=0x2000;}
  hkv_wmat o; void *dst=xa(hkv_wmat_pack_bytes(&w,g)); if(hkv_wmat_pack(&w,g,dst,&o)){fprintf(stderr,"pack\n");exit(1);}
  free(w.q);free(w.scale);free(w.min); return o;
}
#endif
