import sys, time, subprocess, re, json, urllib.request, os
from bmoe_edge.synthetic import tinymoe
model = tinymoe.fixture("qwen3moe", "Q8_0")
p = subprocess.Popen([sys.executable, "-m", "bmoe_edge", "serve", "-m", str(model), "--port", "0", "-t", "1", "--ctx", "1024"],
                     stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
url = None
while url is None:
    line = p.stderr.readline()
    m = re.search(r"serving (\S+) on (http://[\d.]+:\d+)/v1", line)
    if m: name, url = m[1], m[2]
def ask():
    body = json.dumps({"model": name, "prompt": "Once upon a time", "max_tokens": 128, "temperature": 0}).encode()
    r = urllib.request.urlopen(urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"}))
    return json.loads(r.read())["usage"]["completion_tokens"]
ask()
t0 = time.perf_counter(); n = sum(ask() for _ in range(8)); dt = time.perf_counter() - t0
print(json.dumps({"tokens": n, "seconds": dt, "tok_s": n / dt}))
p.terminate(); p.wait()
