import subprocess, sys, statistics, re, collections
# usage: ab.py ROUNDS OLD NEW -- bench far args
rounds=int(sys.argv[1]); old=sys.argv[2]; new=sys.argv[3]; args=sys.argv[5:]
res=collections.defaultdict(list)
for r in range(rounds):
    for tag,b in (("old",old),("new",new)):
        out=subprocess.run([b,"bench","far"]+args,capture_output=True,text=True).stdout
        for line in out.splitlines():
            m=re.match(r"^(\S+(?: \[alone\])?)\s+(\d+)\s+(\d+) \|\s+([\d.]+)",line)
            if m: res[(m.group(1),m.group(2),m.group(3),tag)].append(float(m.group(4)))
keys=sorted({k[:3] for k in res})
for k in keys:
    o=res[k+("old",)]; n=res[k+("new",)]
    print(f"{k[0]:42s} {k[1]:>6s} {k[2]:>3s}  old {statistics.median(o):7.3f} [{min(o):.3f}-{max(o):.3f}]  new {statistics.median(n):7.3f} [{min(n):.3f}-{max(n):.3f}]  {statistics.median(n)/statistics.median(o):.2f}x")
