"""The arbiter's mutants in test_chooser.py's world (BENCHMARKS.md, "The chooser under attack"): each
patched in turn, auto over the best of plain and the fixed drafts in every case. Not a test: run it
from the repository's root, `python tests/chooser_mutants.py` (about 3 minutes on two cores)."""

import os
import sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bytemtp.decoding import drafting as D, decode
import test_chooser as T
class MP:
    def __init__(self): self.undo=[]
    def setattr(self, obj, name, val):
        self.undo.append((obj,name,getattr(obj,name))); setattr(obj,name,val)
    def reset(self):
        for o,n,v in reversed(self.undo): setattr(o,n,v)
        self.undo=[]
cases=[(s,B,False) for s in T.SCENARIOS for B in (1,8)]+[("never",8,True),("always",8,True)]
fixed={}
def judge(name):
    out=[]
    for scen,B,mixed in cases:
        mp=MP()
        if (scen,B,mixed) not in fixed:
            fixed[scen,B,mixed]={m:T._rate(mp, scen, B, m, mixed=mixed) for m in T.FIXED}; mp.reset()
        a=T._rate(mp, scen, B, "auto", mixed=mixed); mp.reset()
        out.append(f"{scen}-{B}{'-mixed' if mixed else ''}:{a/max(fixed[scen,B,mixed].values()):.3f}")
    print(name+":", " ".join(out), flush=True)
judge("the arbiter")
orig_arm, orig_plan, orig_hb = D.Arbiter.arm, decode.Decoder.plan, D.Arbiter.holds_back
D.Arbiter.arm = lambda self, try_s=0.0, *, promising=False: (False, D.PLAN_PASSES); D.Arbiter.holds_back=lambda self: True
judge("always plain")
D.Arbiter.holds_back = lambda self: False
D.Arbiter.arm = lambda self, try_s=0.0, *, promising=False: (True, D.PLAN_PASSES)
judge("always speculate")
D.Arbiter.arm, D.Arbiter.holds_back = orig_arm, orig_hb
def plan_no_arbiter(self, draft, *, batch_size, static, greedy):
    if not draft.adapts(greedy):
        return D.Choice(draft.heads, D.DraftTree.chain(draft.heads - 1), 0.0, 0.0)
    costs = self.pass_costs(batch_size, static=static)
    return D.choose(self.profiles[greedy], costs, max_heads=self.model.config.n_future, tree=draft.trees(greedy), heads=draft.heads, arbiter=None, lookup=draft.lookup)
decode.Decoder.plan = plan_no_arbiter
judge("no arbiter (margin only)")
decode.Decoder.plan = orig_plan
orig_record = D.Arbiter.record
def record(self, *, speculative, rate, seconds, rewarm_s=0.0, trial=True, short=False):
    if not speculative and not short:
        self._all = getattr(self, "_all", []) + [rate]
    return orig_record(self, speculative=speculative, rate=rate, seconds=seconds, rewarm_s=rewarm_s, trial=trial, short=short)
def plain(self):
    seen = getattr(self, "_all", [])
    if not seen: return None
    p = seen[0]
    for r in seen[1:]: p = 0.7 * p + 0.3 * r
    return p
D.Arbiter.record = record; D.Arbiter.plain = property(plain)
judge("plain from one window, then a running mean")
