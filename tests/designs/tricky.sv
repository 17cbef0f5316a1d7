// Robustness design: enum FSM, unique case, casez, a function, a non-ANSI submodule, nested ternaries,
// generate if/else without begin/end, a macro statement, always_latch, a memory, nested generate, labels.
`define BUMP(x) x <= x + 1'b1
module pri_enc (in, out, valid);
  input [3:0] in;
  output reg [1:0] out;
  output valid;
  reg [1:0] tmp;
  integer k;
  assign valid = |in;
  always @* begin
    out = 2'd0;
    for (k = 0; k < 4; k = k + 1)
      if (in[k]) out = k[1:0];
  end
endmodule

module tricky #(parameter W = 4, parameter USE_LATCH = 1) (
  input  wire         clk, rst,
  input  wire [W-1:0] a, b,
  input  wire [1:0]   sel,
  output reg  [W-1:0] y,
  output wire [1:0]   enc,
  output wire         v
);
  typedef enum logic [1:0] {S_IDLE, S_A, S_B} state_t;
  state_t st, st_n;
  reg [W-1:0] mem [0:3];
  reg [W-1:0] cnt;
  logic lat;

  function automatic [W-1:0] maxf(input [W-1:0] x, input [W-1:0] z);
    maxf = (x > z) ? x : z;
  endfunction

  always_ff @(posedge clk) begin : seq_blk
    if (rst) begin st <= S_IDLE; cnt <= '0; end
    else begin
      st <= st_n;
      `BUMP(cnt);
      mem[cnt[1:0]] <= a;
    end
  end

  always_comb begin
    st_n = st;
    unique case (st)
      S_IDLE: if (a[0] && !b[0]) st_n = S_A; else if (b[0]) st_n = S_B;
      S_A:    st_n = S_B;
      S_B:    begin st_n = S_IDLE; end
      default: ;
    endcase
  end

  always_comb begin
    casez (sel)
      2'b1?: y = maxf(a, b);
      2'b01: y = sel[0] ? a ^ b : a | b;
      default: y = mem[0];
    endcase
  end

  generate
    if (!USE_LATCH)
      always @* lat = 1'b0;
    else
      always_latch if (clk) lat = a[0] || b[0];
  endgenerate

  genvar gi;
  generate for (gi = 0; gi < 2; gi = gi + 1) begin : g_outer
    if (gi == 0) begin : g_first
      wire t0 = a[gi] & b[gi];
    end else begin : g_other
      reg r0;
      always @(posedge clk) r0 <= a[gi] | b[gi];
    end
  end endgenerate

  pri_enc u_enc (.in(a[3:0]), .out(enc), .valid(v));
endmodule
