/* cost of a barrier inside one parallel region, N threads; median/min of reps */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(void){
  double t[51];
  for(int r=0;r<51;r++){
    double t0=now();
    #pragma omp parallel
    for(int i=0;i<2000;i++){
      #pragma omp barrier
    }
    t[r]=(now()-t0)/2000*1e6;
  }
  qsort(t,51,sizeof*t,cmp);
  printf("threads %d: barrier %.2f us median, %.2f us min\n",omp_get_max_threads(),t[25],t[0]);
  return 0;
}
