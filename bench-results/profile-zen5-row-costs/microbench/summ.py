import re, statistics, sys
cur=None; res={}
for line in open(sys.argv[1]):
    m=re.match(r"=== round (\d+) (\w+)", line)
    if m: cur=m.group(2); continue
    m=re.match(r"\| (\d+) \| ([\d.]+) / ([\d.]+) \|", line)
    if m and cur: res.setdefault((cur,int(m.group(1))),[]).append(float(m.group(3)))
for k,v in sorted(res.items()): print(k, v, "median %.2f" % statistics.median(v))
for r in sorted({k[1] for k in res}):
    b=res[('base',r)]; n=res[('new',r)]
    print(r, "paired base-new:", [round(x-y,2) for x,y in zip(b,n)], "median %.2f" % statistics.median([x-y for x,y in zip(b,n)]))
