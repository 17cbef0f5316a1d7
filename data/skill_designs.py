"""Synthetic skill families: designs whose coverage needs what the spec states, which random input will not hit.

Each family is a function `fam_<name>(rng) -> dict` drawing its parameters (codes, opcodes, latencies,
terminal values, header fields) and returning the RTL, an English spec and a *known stimulus*: statements
for harness.py's `stimulus` block that follow the spec (a random warm-up, then every path the spec
describes). Coverage is reachable by construction, since the known stimulus reaches it; constrained random
stays below it because each deep state needs a conjunction of exact values in a row:
  code_lock      opens after K exact 8-bit codes in a row; wrong codes count towards a sticky alarm
  cmd_decoder    a frame is a legal opcode, a length byte, the payload and a checksum (XOR of the rest)
  handshake      req held with its data stable for LAT cycles earns an ack; T transfers reach DONE
  term_counter   counts only while `en` alternates and `key` matches; DONE at a terminal value
  packet_parser  a sync byte, then a destination among three addresses, a length 1..4, the payload
The kit's tests (tests/test_skill_designs.py) check both halves on every family: the known stimulus passes
and the random baseline (data/floor.py) fails.

Rows come out in the kit's task schema (as data/designs.py): id skill_<family>_<seed>, rtl_files,
spec_files, dut_module_name, dut_instance_name, instruction, targets (CVDP-style 90 %), difficulty "hard",
is_agentic False, family, split "skill", plus known_stimulus (the constructed stimulus body) and
skill = {"source": "synthetic", "family": ...}. data/skill.py calibrates them (random floor, reachable
coverage, target) with the real designs.

API: SKILL_FAMILIES, make_task(family, seed), generate_tasks(n, seed=0, families=None).
"""
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # kit root
from data.designs import instance_name, instruction_text  # noqa: E402

WARMUP = "repeat (300) begin random_inputs(); step(1); end\n"   # toggles every input bit; each family then
                                                                  # sets its inputs idle and resets


def _hex(v):
    return f"8'h{v:02x}"


def _distinct(rng, n, avoid=()):
    vals = []
    while len(vals) < n:
        v = rng.randrange(256)
        if v not in vals and v not in avoid:
            vals.append(v)
    return vals


def _spec(title, overview, ports, behaviour):
    rows = "\n".join(f"| `{n}` | {d} | {w} | {desc} |" for n, d, w, desc in ports)
    return (f"# `{title}` specification\n\n{overview}\n\n## Ports\n\n| name | direction | width | description |\n"
            f"|---|---|---|---|\n{rows}\n\n## Behaviour\n\n" + "\n".join(f"- {b}" for b in behaviour)
            + "\n\n## Reset\n\n`rst_n` is active-low and asynchronous; it returns the design to its first state.\n")


CLK_RST = [("clk", "input", 1, "Clock, rising edge."), ("rst_n", "input", 1, "Asynchronous reset, active low.")]


# ----------------------------------------------------------------------------------------------
# families

def fam_code_lock(rng):
    """A lock that opens on K exact 8-bit codes in a row; MAXFAIL wrong codes raise a sticky alarm."""
    k, maxfail, hold = rng.randint(3, 5), 3, 15     # 3 failures: both bits of `fails` count
    code = _distinct(rng, k)
    names = [f"GOT{i}" if i else "IDLE" for i in range(k)] + ["OPEN", "ALARM"]
    enc = "\n".join(f"  localparam [2:0] {n} = 3'd{i};" for i, n in enumerate(names))
    arms = []
    for i in range(k):
        nxt = names[i + 1] if i + 1 < k else "OPEN"
        arms.append(f"""      {names[i]}: if (key_valid) begin
        if (key == {_hex(code[i])}) state <= {nxt};
        else if (fails == 2'd{maxfail - 1}) state <= ALARM;
        else begin fails <= fails + 2'd1; state <= IDLE; end
      end""")
    rtl = f"""module code_lock (
  input clk,
  input rst_n,
  input key_valid,
  input [7:0] key,
  output reg unlocked,
  output reg alarm
);
{enc}
  reg [2:0] state;
  reg [1:0] fails;
  reg [3:0] hold;
  always @(posedge clk or negedge rst_n) begin
    if (!rst_n) begin
      state <= IDLE; fails <= 2'd0; hold <= 4'd0; unlocked <= 1'b0; alarm <= 1'b0;
    end else begin
      case (state)
{chr(10).join(arms)}
      OPEN: begin
        unlocked <= 1'b1; fails <= 2'd0; hold <= hold + 4'd1;
        if (hold == 4'd{hold}) begin unlocked <= 1'b0; hold <= 4'd0; state <= IDLE; end
      end
      ALARM: alarm <= 1'b1;
      endcase
    end
  end
endmodule
"""
    enter = lambda vals: "".join(f"key = {_hex(v)}; step(1);\n" for v in vals)
    slow = lambda vals: "".join(f"key_valid = 1'b1; key = {_hex(v)}; step(1); key_valid = 1'b0; step(1);\n"
                                for v in vals)
    reset = "key_valid = 1'b0;\nreset_dut();\nkey_valid = 1'b1;\n"     # idle while the reset is released
    known = []
    for i in range(k):      # a wrong code at every position: first a plain failure, then the one that alarms
        known.append(reset + enter(code[:i]) + enter([code[i] ^ 0xff]))
        known.append(reset + enter([code[0] ^ 0x0f] * (maxfail - 1)) + enter(code[:i]) + enter([code[i] ^ 0xff])
                     + "step(1);")
    known.append(reset + "key_valid = 1'b0;\n" + slow(code) + f"step({hold + 4});\nreset_dut();")
    spec = _spec("code_lock", f"A keypad lock that opens after the {k}-byte code "
                 + ", ".join(f"0x{v:02X}" for v in code) + " is entered in a row.",
                 CLK_RST + [("key_valid", "input", 1, "A key byte is present this cycle."),
                            ("key", "input", 8, "The key byte."),
                            ("unlocked", "output", 1, f"High for {hold + 1} cycles once the code is complete."),
                            ("alarm", "output", 1, "Sticky: set after too many wrong codes, cleared by reset.")],
                 [f"Each valid key byte must equal the next byte of the code; a wrong byte restarts from the first "
                  f"byte and counts one failure; the {maxfail}th failure enters the ALARM state, which only reset leaves.",
                  "Cycles without key_valid hold the state.",
                  f"After the last byte the lock is OPEN: `unlocked` stays high for {hold + 1} cycles and the failure "
                  "count clears."])
    return {"module": "code_lock", "rtl": rtl, "spec": spec, "known": "\n".join(known) + "\n"}


def fam_cmd_decoder(rng):
    """Frames of opcode, length, payload and XOR checksum; each of four opcodes runs its own command."""
    n = rng.randint(2, 3)
    ops = _distinct(rng, 4)
    while (ops[0] | ops[1] | ops[2] | ops[3]) != 0xff or (ops[0] & ops[1] & ops[2] & ops[3]):
        ops = _distinct(rng, 4)             # every bit of `op` both set and clear by some opcode
    names = ["WAIT_OP", "GET_LEN", "GET_PAY", "GET_SUM", "EXEC"]
    enc = "\n".join(f"  localparam [2:0] {s} = 3'd{i};" for i, s in enumerate(names))
    legal = " || ".join(f"in_byte == {_hex(o)}" for o in ops)
    rtl = f"""module cmd_decoder (
  input clk,
  input rst_n,
  input in_valid,
  input [7:0] in_byte,
  output reg [7:0] reg_a,
  output reg [7:0] reg_b,
  output reg done,
  output reg err
);
{enc}
  reg [2:0] state;
  reg [7:0] op, sum, p0, p1;
  reg [1:0] cnt;
  always @(posedge clk or negedge rst_n) begin
    if (!rst_n) begin
      state <= WAIT_OP; op <= 8'd0; sum <= 8'd0; p0 <= 8'd0; p1 <= 8'd0; cnt <= 2'd0;
      reg_a <= 8'd0; reg_b <= 8'd0; done <= 1'b0; err <= 1'b0;
    end else begin
      done <= 1'b0;
      case (state)
      WAIT_OP: if (in_valid) begin
        if ({legal}) begin op <= in_byte; sum <= in_byte; state <= GET_LEN; err <= 1'b0; end
        else err <= 1'b1;
      end
      GET_LEN: if (in_valid) begin
        if (in_byte == 8'd{n}) begin sum <= sum ^ in_byte; cnt <= 2'd0; state <= GET_PAY; end
        else begin err <= 1'b1; state <= WAIT_OP; end
      end
      GET_PAY: if (in_valid) begin
        sum <= sum ^ in_byte;
        if (cnt == 2'd0) p0 <= in_byte;
        if (cnt == 2'd1) p1 <= in_byte;
        cnt <= cnt + 2'd1;
        if (cnt == 2'd{n - 1}) state <= GET_SUM;
      end
      GET_SUM: if (in_valid) begin
        if (in_byte == sum) state <= EXEC;
        else begin err <= 1'b1; state <= WAIT_OP; end
      end
      EXEC: begin
        done <= 1'b1;
        state <= WAIT_OP;
        case (op)
          {_hex(ops[0])}: reg_a <= p0;
          {_hex(ops[1])}: reg_b <= p1;
          {_hex(ops[2])}: reg_a <= reg_a + p0;
          {_hex(ops[3])}: reg_b <= reg_a ^ p1;
        endcase
      end
      endcase
    end
  end
endmodule
"""

    def frame(op, pay, good_len=True, good_sum=True):
        s = op ^ n
        for b in pay:
            s ^= b
        body = [op, n if good_len else (n + 1) & 0xff] + (pay if good_len else [])
        if good_len:
            body.append(s if good_sum else s ^ 0x01)
        return "".join(f"in_byte = {_hex(b)}; step(1);\n" for b in body) + "step(1);\n"
    pay = lambda a, b: [a, b, 0x3c][:n]
    known = ["in_valid = 1'b0;\nreset_dut();\nin_valid = 1'b1;",
             frame(ops[0], pay(0xff, 0x00)), frame(ops[1], pay(0x00, 0xff)), frame(ops[2], pay(0x01, 0x00)),
             frame(ops[3], pay(0x00, 0xff)), frame(ops[0], pay(0x00, 0x00)), frame(ops[1], pay(0x00, 0x00)),
             frame(ops[2], pay(0xff, 0x00)), frame(ops[3], pay(0x00, 0x00)),
             frame(ops[0], pay(0x55, 0xaa), good_len=False), frame(ops[1], pay(0x55, 0xaa), good_sum=False),
             f"in_byte = {_hex(_distinct(rng, 1, ops)[0])}; step(2);",
             "in_valid = 1'b0; step(2); in_valid = 1'b1;",
             "in_valid = 1'b0;\n" + "".join(f"in_byte = {_hex(b)}; in_valid = 1'b1; step(1); in_valid = 1'b0; step(1);\n"
                                            for b in [ops[0], n, *pay(0x12, 0x34)]),
             "step(2);"]
    spec = _spec("cmd_decoder", "A command decoder: a frame is an opcode byte, a length byte, the payload and an "
                 "XOR checksum; a correct frame runs the opcode's command.",
                 CLK_RST + [("in_valid", "input", 1, "A frame byte is present this cycle."),
                            ("in_byte", "input", 8, "The frame byte."),
                            ("reg_a", "output", 8, "Register A."), ("reg_b", "output", 8, "Register B."),
                            ("done", "output", 1, "One-cycle pulse after a command ran."),
                            ("err", "output", 1, "An illegal opcode, wrong length or bad checksum was seen.")],
                 ["Opcodes: " + ", ".join(f"0x{o:02X}" for o in ops) + "; any other first byte sets `err`.",
                  f"The length byte must be {n}; then {n} payload bytes p0, p1, ... follow.",
                  "The checksum byte must equal the XOR of the opcode, the length and every payload byte, else `err`.",
                  f"Commands: 0x{ops[0]:02X}: A = p0; 0x{ops[1]:02X}: B = p1; 0x{ops[2]:02X}: A = A + p0; "
                  f"0x{ops[3]:02X}: B = A ^ p1.", "Bytes count only on cycles with in_valid high."])
    return {"module": "cmd_decoder", "rtl": rtl, "spec": spec, "known": "\n".join(known) + "\n"}


def fam_handshake(rng):
    """A request/acknowledge sink: req held with stable data for LAT cycles is acknowledged; T transfers end in DONE."""
    lat, total = rng.randint(3, 4), rng.randint(4, 5)      # lat >= 3, total >= 4: every counter bit counts
    names = ["IDLE", "WAIT", "ACK", "RELEASE", "ERROR", "DONE"]
    enc = "\n".join(f"  localparam [2:0] {s} = 3'd{i};" for i, s in enumerate(names))
    rtl = f"""module handshake_sink (
  input clk,
  input rst_n,
  input req,
  input [7:0] data,
  output reg ack,
  output reg [7:0] captured,
  output reg proto_err,
  output reg done
);
{enc}
  reg [2:0] state;
  reg [7:0] held;
  reg [1:0] wait_cnt;
  reg [2:0] count;
  always @(posedge clk or negedge rst_n) begin
    if (!rst_n) begin
      state <= IDLE; held <= 8'd0; wait_cnt <= 2'd0; count <= 3'd0;
      ack <= 1'b0; captured <= 8'd0; proto_err <= 1'b0; done <= 1'b0;
    end else begin
      case (state)
      IDLE: if (req) begin held <= data; wait_cnt <= 2'd0; state <= WAIT; end
      WAIT: begin
        if (!req || data != held) begin proto_err <= 1'b1; state <= ERROR; end
        else if (wait_cnt == 2'd{lat - 1}) begin ack <= 1'b1; captured <= held; state <= ACK; end
        else wait_cnt <= wait_cnt + 2'd1;
      end
      ACK: begin ack <= 1'b0; count <= count + 3'd1; state <= RELEASE; end
      RELEASE: if (!req) state <= (count == 3'd{total}) ? DONE : IDLE;
      ERROR: proto_err <= 1'b1;
      DONE: done <= 1'b1;
      endcase
    end
  end
endmodule
"""
    values = [0xff, 0x00, 0xa5, 0x5a, 0xff][:total]
    xfer = lambda v: f"data = {_hex(v)}; req = 1'b1; step({lat + 3}); req = 1'b0; step(2);\n"
    known = ["req = 1'b0;\nreset_dut();", "".join(xfer(v) for v in values) + "step(2);",
             "reset_dut();\ndata = 8'h3c; req = 1'b1; step(1); req = 1'b0; step(2);",
             "reset_dut();\ndata = 8'h3c; req = 1'b1; step(1); data = 8'hc3; step(2); req = 1'b0; step(1);",
             "req = 1'b0;\nreset_dut();\n" + xfer(0x81) + "req = 1'b1; data = 8'h7e; step(1);"]
    spec = _spec("handshake_sink", "The receiving side of a request/acknowledge handshake.",
                 CLK_RST + [("req", "input", 1, "Request from the sender."), ("data", "input", 8, "Request data."),
                            ("ack", "output", 1, "One-cycle acknowledge: the data was captured."),
                            ("captured", "output", 8, "The last acknowledged data."),
                            ("proto_err", "output", 1, "Sticky protocol error."),
                            ("done", "output", 1, f"Sticky: {total} transfers completed.")],
                 [f"The sender raises `req` with `data`; it must hold both, unchanged, for {lat} cycles, after which "
                  "the sink pulses `ack` and captures the data.",
                  "Dropping `req` or changing `data` before the acknowledge is a protocol error (ERROR state until "
                  "reset).", "After the acknowledge the sender must drop `req` before the next transfer.",
                  f"After {total} completed transfers the sink enters DONE."])
    return {"module": "handshake_sink", "rtl": rtl, "spec": spec, "known": "\n".join(known) + "\n"}


def fam_term_counter(rng):
    """A counter that steps only while `en` alternates and `key` matches, and flags DONE at a terminal value."""
    key, term = rng.randrange(16), rng.randint(33, 60)      # count[5] rises only near the end
    rtl = f"""module term_counter (
  input clk,
  input rst_n,
  input en,
  input [3:0] key,
  output reg [5:0] count,
  output reg done
);
  reg en_q;
  always @(posedge clk or negedge rst_n) begin
    if (!rst_n) begin
      count <= 6'd0; done <= 1'b0; en_q <= 1'b0;
    end else begin
      en_q <= en;
      if (done) count <= count;
      else if (en && en_q) count <= 6'd0;
      else if (en && key == 4'd{key}) begin
        count <= count + 6'd1;
        if (count == 6'd{term - 1}) done <= 1'b1;
      end else if (en) count <= 6'd0;
    end
  end
endmodule
"""
    other = (key + 5) % 16
    run = lambda k: f"repeat ({k}) begin en = 1'b1; key = 4'd{key}; step(1); en = 1'b0; step(1); end\n"
    known = ["en = 1'b0;\nreset_dut();",
             run(5) + "en = 1'b1; step(2); en = 1'b0;",                   # two enables in a row clear
             run(5) + f"en = 1'b1; key = 4'd{other}; step(1); en = 1'b0; step(1);",   # a wrong key clears
             "reset_dut();\n" + run(63) + "step(2);\nreset_dut();"]
    spec = _spec("term_counter", f"A counter that must be stepped {term} times by a strict enable pattern.",
                 CLK_RST + [("en", "input", 1, "Step request."), ("key", "input", 4, "Step key."),
                            ("count", "output", 6, "Steps so far."),
                            ("done", "output", 1, f"Sticky: the count reached {term}.")],
                 [f"A cycle with `en` high and `key` = {key} steps the counter, when `en` was low the cycle before.",
                  "`en` high on two cycles in a row, or `en` high with another key, clears the counter.",
                  f"When the counter reaches {term}, `done` rises and the counter freezes until reset."])
    return {"module": "term_counter", "rtl": rtl, "spec": spec, "known": "\n".join(known) + "\n"}


def fam_packet_parser(rng):
    """A byte-stream parser: sync byte, a destination among three addresses, a length 1..4, then the payload."""
    sync, *dests = _distinct(rng, 4)
    names = ["HUNT", "DEST", "LEN", "PAYLOAD"]
    enc = "\n".join(f"  localparam [1:0] {s} = 2'd{i};" for i, s in enumerate(names))
    rtl = f"""module packet_parser (
  input clk,
  input rst_n,
  input in_valid,
  input [7:0] in_byte,
  output reg [7:0] port0,
  output reg [7:0] port1,
  output reg [7:0] port2,
  output reg [2:0] port_hit,
  output reg drop
);
{enc}
  reg [1:0] state;
  reg [1:0] dest;
  reg [2:0] left;
  always @(posedge clk or negedge rst_n) begin
    if (!rst_n) begin
      state <= HUNT; dest <= 2'd0; left <= 3'd0;
      port0 <= 8'd0; port1 <= 8'd0; port2 <= 8'd0; port_hit <= 3'd0; drop <= 1'b0;
    end else begin
      port_hit <= 3'd0;
      case (state)
      HUNT: if (in_valid && in_byte == {_hex(sync)}) begin drop <= 1'b0; state <= DEST; end
      DEST: if (in_valid) begin
        if (in_byte == {_hex(dests[0])}) begin dest <= 2'd0; state <= LEN; end
        else if (in_byte == {_hex(dests[1])}) begin dest <= 2'd1; state <= LEN; end
        else if (in_byte == {_hex(dests[2])}) begin dest <= 2'd2; state <= LEN; end
        else begin drop <= 1'b1; state <= HUNT; end
      end
      LEN: if (in_valid) begin
        if (in_byte != 8'd0 && in_byte <= 8'd4) begin left <= in_byte[2:0]; state <= PAYLOAD; end
        else begin drop <= 1'b1; state <= HUNT; end
      end
      PAYLOAD: if (in_valid) begin
        case (dest)
          2'd0: begin port0 <= in_byte; port_hit[0] <= 1'b1; end
          2'd1: begin port1 <= in_byte; port_hit[1] <= 1'b1; end
          2'd2: begin port2 <= in_byte; port_hit[2] <= 1'b1; end
        endcase
        left <= left - 3'd1;
        if (left == 3'd1) state <= HUNT;
      end
      endcase
    end
  end
endmodule
"""
    send = lambda bs: "".join(f"in_byte = {_hex(b)}; step(1);\n" for b in bs) + "step(1);\n"
    known = [f"in_valid = 1'b0; in_byte = {_hex(sync)};\nreset_dut();\nstep(1);\nin_valid = 1'b1;"]
    for i, d in enumerate(dests):
        known.append(send([sync, d, 4, 0xff, 0x00, 0xff, 0x00]))
    known += [send([sync, dests[0], 1, 0x5a]), send([sync, dests[1], 0, 0x11]), send([sync, dests[2], 9, 0x11]),
              send([sync, (dests[0] + 1) & 0xff if (dests[0] + 1) & 0xff not in (sync, *dests) else 0x00, 0x11]),
              "in_valid = 1'b0; step(2); in_valid = 1'b1;",
              "in_valid = 1'b0;\n" + "".join(f"in_byte = {_hex(b)}; in_valid = 1'b1; step(1); in_valid = 1'b0; step(1);\n"
                                             for b in [sync, dests[1], 2, 0x42, 0x24])]
    spec = _spec("packet_parser", "A parser that routes packet payloads to one of three ports by a header field.",
                 CLK_RST + [("in_valid", "input", 1, "A stream byte is present this cycle."),
                            ("in_byte", "input", 8, "The stream byte."),
                            ("port0", "output", 8, "Last payload byte for destination 0."),
                            ("port1", "output", 8, "Last payload byte for destination 1."),
                            ("port2", "output", 8, "Last payload byte for destination 2."),
                            ("port_hit", "output", 3, "One-hot pulse: the port that got a byte this cycle."),
                            ("drop", "output", 1, "The last packet was dropped (bad destination or length).")],
                 [f"A packet starts with the sync byte 0x{sync:02X}; other bytes are skipped while hunting.",
                  "The next byte is the destination: " + ", ".join(f"0x{d:02X} (port {i})" for i, d in enumerate(dests))
                  + "; any other value drops the packet.",
                  "Then a length byte, 1 to 4; any other length drops the packet.",
                  "Then that many payload bytes, each written to the destination's port with a `port_hit` pulse.",
                  "Bytes count only on cycles with in_valid high."])
    return {"module": "packet_parser", "rtl": rtl, "spec": spec, "known": "\n".join(known) + "\n"}


SKILL_FAMILIES = {"code_lock": fam_code_lock, "cmd_decoder": fam_cmd_decoder, "handshake": fam_handshake,
                  "term_counter": fam_term_counter, "packet_parser": fam_packet_parser}


def make_task(family, seed):
    """One skill task of `family` drawn with integer `seed` (deterministic)."""
    if family not in SKILL_FAMILIES:
        raise ValueError(f"unknown skill family {family!r}; known: {', '.join(SKILL_FAMILIES)}")
    d = SKILL_FAMILIES[family](random.Random(f"skill:{family}:{seed}"))
    tid = f"skill_{family}_{seed}"
    inst = instance_name(tid, d["module"])
    return {"id": tid, "spec_files": [{"name": "specification.md", "content": d["spec"]}],
            "rtl_files": [{"name": f"{d['module']}.sv", "content": d["rtl"]}],
            "dut_module_name": d["module"], "dut_instance_name": inst, "instruction": instruction_text(d["module"], inst),
            "targets": [{"inst_name": inst, "metric": "overall_average", "target_percentage": 90.0}],
            "difficulty": "hard", "is_agentic": False, "family": family, "split": "skill",
            "known_stimulus": WARMUP + d["known"], "skill": {"source": "synthetic", "family": family}}


def generate_tasks(n, seed=0, families=None):
    """n skill tasks, families round-robin; design i gets the integer seed seed * 100000 + i."""
    fams = list(families or SKILL_FAMILIES)
    return [make_task(fams[i % len(fams)], seed * 100000 + i) for i in range(n)]
