#include <x86intrin.h>
#include <cstdio>
#define D(r) "vpdpbusd %%zmm16, %%zmm17, %%zmm" #r "\n\t"
#define DP D(0) D(1) D(2) D(3) D(4) D(5) D(6) D(7) D(8) D(9) D(10) D(11)
#define X4(op) op " %%zmm16, %%zmm17, %%zmm18\n\t" op " %%zmm16, %%zmm17, %%zmm19\n\t" op " %%zmm16, %%zmm17, %%zmm20\n\t" op " %%zmm16, %%zmm17, %%zmm21\n\t"
#define X8(op) X4(op) op " %%zmm16, %%zmm17, %%zmm22\n\t" op " %%zmm16, %%zmm17, %%zmm23\n\t" op " %%zmm16, %%zmm17, %%zmm24\n\t" op " %%zmm16, %%zmm17, %%zmm25\n\t"
#define CL "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15","xmm16","xmm17","xmm18","xmm19","xmm20","xmm21","xmm22","xmm23","xmm24","xmm25","cc"
#define RUN(body) ({ long k=n; unsigned long t0=__rdtsc(); __asm__ volatile("1:\n\t" body "dec %0\n\tjnz 1b":"+r"(k)::CL); (double)(__rdtsc()-t0)/n; })
int main(){
  long n=10000000;
  for(int rep=0;rep<2;rep++){
  printf("12 dpbusd            %.2f\n", RUN(DP));
  printf("+4 pmaddubsw         %.2f\n", RUN(DP X4("vpmaddubsw")));
  printf("+8 pmaddubsw         %.2f\n", RUN(DP X8("vpmaddubsw")));
  printf("8 pmaddubsw alone    %.2f\n", RUN(X8("vpmaddubsw")));
  printf("+4 pmaddwd           %.2f\n", RUN(DP X4("vpmaddwd")));
  printf("+4 psadbw            %.2f\n", RUN(DP X4("vpsadbw")));
  printf("8 psadbw alone       %.2f\n", RUN(X8("vpsadbw")));
  printf("+4 paddw             %.2f\n", RUN(DP X4("vpaddw")));
  printf("+8 pshufb            %.2f\n", RUN(DP X8("vpshufb")));
  printf("8 pshufb alone       %.2f\n", RUN(X8("vpshufb")));
  printf("+4 vpermb            %.2f\n", RUN(DP X4("vpermb")));
  printf("+4 pmullw            %.2f\n", RUN(DP X4("vpmullw")));
  printf("+8 paddd             %.2f\n", RUN(DP X8("vpaddd")));
  }
}
