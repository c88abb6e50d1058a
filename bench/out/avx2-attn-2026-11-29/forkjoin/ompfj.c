/* cost of an empty parallel region (fork + join) on N threads, pinned; median/min of reps */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(void){
  volatile int sink=0; double t[51];
  for(int r=0;r<51;r++){
    double t0=now();
    for(int i=0;i<2000;i++){
      #pragma omp parallel
      { if(omp_get_thread_num()==1) sink++; }
    }
    t[r]=(now()-t0)/2000*1e6;
  }
  qsort(t,51,sizeof*t,cmp);
  printf("threads %d: empty parallel region %.2f us median, %.2f us min\n",omp_get_max_threads(),t[25],t[0]);
  return 0;
}
