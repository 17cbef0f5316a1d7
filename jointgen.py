"""Several adapters of one model sampling in shared generate calls: each policy (rl.py's experts, distill.py's
students, evaluate.py's models) runs in its own thread, and their generate calls meet in one (fastgen's stack rule
on the fast path: decode is bound by its steps, not its rows). Below the trainers and evaluate.py, so each of them
imports it.

    JointGenerate   the rendezvous: member(name) is a policy's generate; enter/leave bracket its rollouts
    joint_collect   run collect(member) for every member in its own thread, inside its rollouts
"""
import json
import threading

import common


class JointGenerate:
    """Several policies' rollouts in shared generate calls: each policy (a trainable adapter of one model, rl.py's
    experts or distill.py's students in one process) rolls out in its own thread, and its generate call waits until
    every policy still rolling out has one waiting; then one call serves them all (fastgen's stack rule: decode is
    bound by its steps, not its rows, so three experts' rollouts cost about one's). The rows keep the policies'
    order, each under its own adapter; the call's seed is the first waiting policy's. Where generate takes the HF
    path (CPU), each policy's rows run as their own call with their own seed, under their adapter: the samples of a
    run alone. A policy whose rollouts end leaves (leave()), so the others never wait on it. An error in the call
    reaches every policy in it.
    A call may carry rows beside the policy's (beside=(messages, adapter names, seeds): distill.py's teachers on the
    student's prompts). A beside row that several waiting policies ask for (the same adapter, seed and prompt) runs
    once and each of them gets it: the teachers' answers to a prompt the students share are decoded once. They
    follow the policies' rows in the call; on the HF path they are one call whose rows of one (adapter, seed) run
    apart with that seed (common.generate's seeds), so each policy gets the rows it would sample alone.
    A policy's on_done (common.generate's) hears of each of its answers as it finishes, numbered as in what its call
    returns (its rows, then its beside rows); a beside row several policies share reaches each of them. An error in a
    policy's on_done reaches that policy alone (its call raises it); the others get their answers.

        joint = JointGenerate(model, tok, ["expert0", "expert1"])
        gen = joint.member("expert0")      # make_model_source(gen=...), called from that policy's thread
    """

    def __init__(self, model, tok, names, fast=None):
        self.model, self.tok, self.names, self.fast = model, tok, list(names), fast
        self.stack = list(names)         # the fast path's stacked adapters: the policies', then the beside rows'
        self.cv = threading.Condition()
        self.rolling = set()             # policies inside their rollouts
        self.waiting = {}                # name -> (messages_list, kw, beside, on_done) of its waiting call
        self.answers = {}                # name -> completions, or the exception of its call
        self.calls = []                  # [(names in the call, rows)] (tests, logs)
        self.beside = []                 # [(beside rows asked, beside rows run)] per call

    def enter(self, name):
        with self.cv:
            self.rolling.add(name)

    def leave(self, name):
        with self.cv:
            self.rolling.discard(name)
            self._maybe_run()

    def member(self, name):
        def gen(model, tok, messages_list, beside=None, on_done=None, **kw):
            with self.cv:
                self.waiting[name] = (messages_list, kw, beside, on_done)
                self._maybe_run()
                while name not in self.answers:
                    self.cv.wait()
                out = self.answers.pop(name)
            if isinstance(out, BaseException):
                raise out
            return out
        return gen

    @staticmethod
    def _shared_rows(names, batch):
        """The beside rows of the waiting calls, each once: a row is its adapter, seed and prompt, and which copy of
        it it is within its policy's call (a teacher's k answers to one prompt are k rows). Returns the distinct rows
        [(messages, adapter, seed)] and, per policy, the indices of its beside rows among them."""
        index, rows, where = {}, [], {}
        for n in names:
            copies, where[n] = {}, []
            for m, a, s in zip(*(batch[n][2] or ((), (), ()))):
                key = (a, s, json.dumps(m, sort_keys=True))
                copies[key] = copies.get(key, 0) + 1
                if (key, copies[key]) not in index:
                    index[(key, copies[key])] = len(rows)
                    rows.append((m, a, s))
                where[n].append(index[(key, copies[key])])
        return rows, where

    def _maybe_run(self):
        """Under the lock: when every policy still rolling out waits, run their calls as one and hand out the
        answers. (The other threads wait on the lock meanwhile: the decoder has the GPU and the CPU to itself.)"""
        if not self.waiting or not self.rolling <= set(self.waiting):
            return
        names = [n for n in self.names if n in self.waiting]
        batch = {n: self.waiting.pop(n) for n in names}
        self.calls.append((names, [len(batch[n][0]) for n in names]))
        own = {}
        try:
            rows, where = self._shared_rows(names, batch)
            self.beside.append((sum(map(len, where.values())), len(rows)))
            more, adapters, seeds = (list(x) for x in zip(*rows)) if rows else ([], [], [])
            failed = {}                  # a policy whose on_done raised: the error is its own, not the call's

            def guard(n, hear):
                def call(k, c):
                    if n not in failed:
                        try:
                            hear(k, c)
                        except Exception as e:      # noqa: BLE001  (raised in that policy's thread below)
                            failed[n] = e
                return call
            sends = {n: guard(n, batch[n][3]) for n in names if batch[n][3] is not None}   # each policy's on_done
            # a shared row reaches every policy that asked for it, at its place in that policy's answers
            to_shared = {}
            for n in sends:
                for j, r in enumerate(where[n]):
                    to_shared.setdefault(r, []).append((n, len(batch[n][0]) + j))

            def send_shared(r, c):
                for n, k in to_shared.get(r, ()):
                    sends[n](k, c)
            if common.fast_path(self.model, self.fast):
                msgs = [m for n in names for m in batch[n][0]] + more
                # every policy's adapter stacked, whoever waits: one decoder state and its graphs for all calls;
                # the rows of all of them in one batch, as each would run its own
                self.stack += [a for a in dict.fromkeys(adapters) if a not in self.stack]
                kw = {**batch[names[0]][1]}
                kw["batch_size"] = kw.get("batch_size", 64) * len(names)
                own_rows = [n for n in names for _ in batch[n][0]]
                place = [(n, k) for n in names for k in range(len(batch[n][0]))]   # call row -> (policy, its row)

                def send(i, c):
                    if i >= len(place):
                        send_shared(i - len(place), c)
                    elif place[i][0] in sends:
                        sends[place[i][0]](place[i][1], c)
                out = common.generate(self.model, self.tok, msgs, adapters=own_rows + adapters,
                                      seeds=[None] * len(own_rows) + seeds, stack=self.stack, fast=self.fast,
                                      on_done=send if sends else None, **kw)
                at = 0
                for n in names:
                    own[n] = out[at:at + len(batch[n][0])]
                    at += len(batch[n][0])
                shared = out[at:]
            else:
                for n in names:
                    with common.use_adapter(self.model, n):
                        own[n] = common.generate(self.model, self.tok, batch[n][0], fast=self.fast,
                                                 on_done=sends.get(n), **batch[n][1])
                shared = [] if not rows else common.generate(
                    self.model, self.tok, more, adapters=adapters, seeds=seeds, fast=self.fast,
                    on_done=send_shared if to_shared else None, **batch[names[0]][1])
            for n in names:
                self.answers[n] = failed[n] if n in failed else list(own[n]) + [shared[i] for i in where[n]]
        except BaseException as e:      # noqa: BLE001  (every policy of the call raises it in its own thread)
            for n in names:
                self.answers[n] = e
        finally:
            self.cv.notify_all()


def joint_collect(members, collect):
    """Run collect(member) for every member in its own thread, each inside its JointGenerate's rollouts
    (member.joint, member.name), and return their results in order; the first error is raised after every
    thread has ended. One member runs in this thread (no rendezvous needed)."""
    if len(members) == 1:
        return [collect(members[0])]
    results, errors = [None] * len(members), [None] * len(members)
    for m in members:
        m.joint.enter(m.name)

    def work(i, m):
        try:
            results[i] = collect(m)
        except BaseException as e:       # noqa: BLE001  (re-raised below, in the caller's thread)
            errors[i] = e
        finally:
            m.joint.leave(m.name)
    threads = [threading.Thread(target=work, args=(i, m), daemon=True) for i, m in enumerate(members)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return results
