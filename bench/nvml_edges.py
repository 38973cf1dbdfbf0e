# ruff: noqa  (kept as it ran on the device: the compact form fitted the 2,000-character command)
"""NVML energy counter at a window's edges on the lent GPU: a plain reading at each edge, and one synchronised
to the counter's ticks (the start on a tick, the end splitting the straddling tick by time), each against an
independent log of the counter's ticks (another thread polling every 2 ms, linear between ticks), over windows of
1.4, 3 and 7 s of bf16 matrix products (~700 W), twice. Self-contained (python3 with torch); run inline on the
device machine (its output: bench/results/nvml_edges_20261206_1557_h100.txt).
"""
import ctypes,time,threading,torch
L=ctypes.CDLL('libnvidia-ml.so.1');L.nvmlInit_v2();h=ctypes.c_void_p();L.nvmlDeviceGetHandleByIndex_v2(0,ctypes.byref(h))
def rd():
 e=ctypes.c_ulonglong();L.nvmlDeviceGetTotalEnergyConsumption(h,ctypes.byref(e));return e.value
log=[];stop=[]
def rec():
 last=None
 while not stop:
  v=rd()
  if v!=last:log.append((time.time(),v));last=v
  time.sleep(0.002)
def at(t):
 for (a,va),(b,vb) in zip(log,log[1:]):
  if a<=t<=b:return va+(vb-va)*(t-a)/(b-a)
def tick(last):
 d=time.monotonic()+0.3
 while time.monotonic()<d:
  v=rd()
  if v!=last:return time.time(),v
  time.sleep(0.002)
x=torch.randn(8192,8192,device='cuda',dtype=torch.bfloat16)
def load(w):
 e=time.monotonic()+w
 while time.monotonic()<e:
  for _ in range(4):y=x@x
  torch.cuda.synchronize()
load(2);threading.Thread(target=rec,daemon=True).start();time.sleep(1)
print('| window s | synced/indep | plain/indep | J |')
for w in [1.4,3,7,1.4,3,7]:
 p0=(time.time(),rd());v0=rd();a=tick(v0);b=tick(a[1]);T=b[0]-a[0]
 load(w)
 p1=(time.time(),rd());now=time.time();u0=rd();t1,u1=tick(u0);s=max(0,min(1,(t1-now)/T));E1=u1-(u1-u0)*s
 time.sleep(0.4);tr=at(now)-at(b[0]);tp=at(p1[0])-at(p0[0])
 print(f'| {w} | {(E1-b[1])/tr:.4f} | {(p1[1]-p0[1])/tp:.4f} | {tr/1000:.0f} | tick {T*1e3:.0f} ms')
 time.sleep(1)
stop.append(1)
