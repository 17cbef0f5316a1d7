// Zero-time glitches: y is set 0 then 1 in one process run; w follows q (a flop) through a chain of
// continuous assigns and an always @*; p changes twice in one time step across the NBA region.
module glitch (
  input  logic clk, a, b,
  output logic y, w, p
);
  logic q, r, s;
  always @(a or b) begin
    y = 1'b0;
    if (a) y = 1'b1;
  end
  always @(posedge clk) q <= b;
  assign r = q ^ b;
  always @* s = ~r;
  assign w = s & a;
  always @(posedge clk) p <= 1'b0;
  always @(negedge p) p <= 1'b1;
endmodule
