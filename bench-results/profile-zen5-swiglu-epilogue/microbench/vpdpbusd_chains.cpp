#include <initializer_list>
#include <x86intrin.h>
#include <cstdio>
int main(){
  for (int chains : {1,2,4,6,8}) {
  long n=20000000; double best=1e30;
  for(int rep=0;rep<3;rep++){
  unsigned long t0=__rdtsc();
  long k=n;
  switch(chains){
#define BODY1 "vpdpbusd %%zmm16, %%zmm17, %%zmm0\n\t"
  case 1: __asm__ volatile("1:\n\t" BODY1 BODY1 BODY1 BODY1 BODY1 BODY1 BODY1 BODY1 "dec %0\n\tjnz 1b":"+r"(k)::"xmm0","xmm16","xmm17","cc"); break;
  case 2: __asm__ volatile("1:\n\t" "vpdpbusd %%zmm16, %%zmm17, %%zmm0\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm1\n\t" "vpdpbusd %%zmm16, %%zmm17, %%zmm0\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm1\n\t""vpdpbusd %%zmm16, %%zmm17, %%zmm0\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm1\n\t""vpdpbusd %%zmm16, %%zmm17, %%zmm0\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm1\n\t" "dec %0\n\tjnz 1b":"+r"(k)::"xmm0","xmm1","xmm16","xmm17","cc"); break;
  case 4: __asm__ volatile("1:\n\t" "vpdpbusd %%zmm16, %%zmm17, %%zmm0\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm1\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm2\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm3\n\t" "vpdpbusd %%zmm16, %%zmm17, %%zmm0\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm1\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm2\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm3\n\t" "dec %0\n\tjnz 1b":"+r"(k)::"xmm0","xmm1","xmm2","xmm3","xmm16","xmm17","cc"); break;
  case 6: __asm__ volatile("1:\n\t" "vpdpbusd %%zmm16, %%zmm17, %%zmm0\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm1\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm2\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm3\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm4\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm5\n\t" "vpdpbusd %%zmm16, %%zmm17, %%zmm0\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm1\n\t" "dec %0\n\tjnz 1b":"+r"(k)::"xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm16","xmm17","cc"); break;
  case 8: __asm__ volatile("1:\n\t" "vpdpbusd %%zmm16, %%zmm17, %%zmm0\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm1\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm2\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm3\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm4\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm5\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm6\n\tvpdpbusd %%zmm16, %%zmm17, %%zmm7\n\t" "dec %0\n\tjnz 1b":"+r"(k)::"xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm16","xmm17","cc"); break;
  default: k=0;
  }
  unsigned long dt=__rdtsc()-t0; double per=(double)dt/(n*8.0); if(per<best)best=per;}
  if (chains<=8 && chains!=0) printf("chains %d: %.3f ref cycles per vpdpbusd\n", chains, best);
  }
}
