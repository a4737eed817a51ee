#include <x86intrin.h>
#include <cstdio>
#include "bodies.h"
alignas(64) unsigned char W[4096], X[4096];
#define RUN(B) { long k=n; const void* w=W; const void* x=X; unsigned long t0=__rdtsc(); \
  __asm__ volatile("1:\n\t" B "dec %0\n\tjnz 1b":"+r"(k):"S"(w),"D"(x):"memory","xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15","xmm16","xmm17","xmm18","xmm19","xmm20","xmm21","xmm22","xmm23","xmm24","xmm25","xmm26","xmm27","xmm28","xmm29","xmm30","xmm31","cc"); \
  t=(double)(__rdtsc()-t0)/n; }
int main(){ long n=5000000; double t;
 for(int rep=0;rep<3;rep++){
  RUN(BODY0) printf("S=0 %.2f ref/64 products (%.2f core)\n",t,t*4.34/2.6);
  RUN(BODY1) printf("S=1 %.2f (%.2f)\n",t,t*4.34/2.6);
  RUN(BODY2) printf("S=2 %.2f (%.2f)\n",t,t*4.34/2.6);
  RUN(BODY3) printf("S=3 %.2f (%.2f)\n",t,t*4.34/2.6);
  RUN(BODY4) printf("S=4 %.2f (%.2f)\n",t,t*4.34/2.6);
  RUN(BODY6) printf("S=6 %.2f (%.2f)\n",t,t*4.34/2.6);
 }}
