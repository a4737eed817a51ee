#include <x86intrin.h>
#include <cstdio>
#define D(r) "vpdpbusd %%zmm16, %%zmm17, %%zmm" #r "\n\t"
#define DP D(0) D(1) D(2) D(3) D(4) D(5) D(6) D(7) D(8) D(9) D(10) D(11)
#define CL "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15","xmm16","xmm17","xmm18","xmm19","xmm20","xmm21","xmm22","xmm23","cc"
template<int V> double run(){
  long n=10000000,k=n; unsigned long t0=__rdtsc();
  if constexpr(V==0) __asm__ volatile("1:\n\t" DP "dec %0\n\tjnz 1b":"+r"(k)::CL);
  if constexpr(V==1) __asm__ volatile("1:\n\t" DP "vpmulld %%zmm16, %%zmm17, %%zmm18\n\tvpmulld %%zmm16, %%zmm17, %%zmm19\n\tvpaddd %%zmm16, %%zmm17, %%zmm20\n\tvpaddd %%zmm16, %%zmm17, %%zmm21\n\t" "dec %0\n\tjnz 1b":"+r"(k)::CL);
  if constexpr(V==2) __asm__ volatile("1:\n\t" DP "vfmadd231ps %%zmm16, %%zmm17, %%zmm18\n\tvfmadd231ps %%zmm16, %%zmm17, %%zmm19\n\tvcvtdq2ps %%zmm16, %%zmm20\n\tvcvtdq2ps %%zmm17, %%zmm21\n\t" "dec %0\n\tjnz 1b":"+r"(k)::CL);
  if constexpr(V==3) __asm__ volatile("1:\n\t" DP "vpandd %%zmm16, %%zmm17, %%zmm18\n\tvpandd %%zmm16, %%zmm17, %%zmm19\n\tvpandnd %%zmm16, %%zmm17, %%zmm20\n\tvpandnd %%zmm16, %%zmm17, %%zmm21\n\t" "dec %0\n\tjnz 1b":"+r"(k)::CL);
  if constexpr(V==4) __asm__ volatile("1:\n\t" DP "vpmulld %%zmm16, %%zmm17, %%zmm18\n\tvpmulld %%zmm16, %%zmm17, %%zmm19\n\tvpmulld %%zmm16, %%zmm17, %%zmm20\n\tvpmulld %%zmm16, %%zmm17, %%zmm21\n\t" "dec %0\n\tjnz 1b":"+r"(k)::CL);
  if constexpr(V==5) __asm__ volatile("1:\n\t" DP "vfmadd231ps %%zmm16, %%zmm17, %%zmm18\n\tvfmadd231ps %%zmm16, %%zmm17, %%zmm19\n\tvfmadd231ps %%zmm16, %%zmm17, %%zmm20\n\tvfmadd231ps %%zmm16, %%zmm17, %%zmm21\n\t" "dec %0\n\tjnz 1b":"+r"(k)::CL);
  if constexpr(V==6) __asm__ volatile("1:\n\t" DP "vpdpwssd %%zmm16, %%zmm17, %%zmm18\n\tvpdpwssd %%zmm16, %%zmm17, %%zmm19\n\tvpdpwssd %%zmm16, %%zmm17, %%zmm20\n\tvpdpwssd %%zmm16, %%zmm17, %%zmm21\n\t" "dec %0\n\tjnz 1b":"+r"(k)::CL);
  if constexpr(V==7) __asm__ volatile("1:\n\t" DP "vcvtdq2ps %%zmm16, %%zmm18\n\tvcvtdq2ps %%zmm16, %%zmm19\n\tvcvtdq2ps %%zmm16, %%zmm20\n\tvcvtdq2ps %%zmm16, %%zmm21\n\t" "dec %0\n\tjnz 1b":"+r"(k)::CL);
  if constexpr(V==8) __asm__ volatile("1:\n\t" DP "vmulps %%zmm16, %%zmm17, %%zmm18\n\tvmulps %%zmm16, %%zmm17, %%zmm19\n\tvaddps %%zmm16, %%zmm17, %%zmm20\n\tvaddps %%zmm16, %%zmm17, %%zmm21\n\t" "dec %0\n\tjnz 1b":"+r"(k)::CL);
  return (double)(__rdtsc()-t0)/n;
}
int main(){
  const char* names[]={"12 dpbusd","+2 pmulld 2 paddd","+2 fma 2 cvt","+4 and/andn","+4 pmulld","+4 fma","+4 vpdpwssd","+4 cvt","+2 mul 2 add"};
  for(int rep=0;rep<2;rep++){
  double t[9]={run<0>(),run<1>(),run<2>(),run<3>(),run<4>(),run<5>(),run<6>(),run<7>(),run<8>()};
  for(int i=0;i<9;i++) printf("%-20s %.2f ref cycles/iter (%.2f core)\n",names[i],t[i],t[i]*4.34/2.6);
  }
}
