import re,sys,statistics
for f in sys.argv[1:]:
    res={}; state=None; mat={}
    for line in open(f):
        m=re.match(r"=== round (\d+) (\S+)",line)
        if m: state=m.group(2).split('/')[-1]; continue
        m=re.match(r"\| (\d+) \| ([\d.]+) / ([\d.]+)",line)
        if m and state: res.setdefault((state,int(m.group(1))),[]).append(float(m.group(2)))
    for k in sorted(res, key=lambda k:(k[1],k[0])): print(f.split('/')[-1], k, 'med %.1f'%statistics.median(res[k]), sorted(res[k]))
