// Known-answer design 1: parameterised up/down counter with load (nested if/else, always_ff).
module counter #(parameter W = 4) (
  input  logic         clk,
  input  logic         rst_n,
  input  logic         load,
  input  logic         en, up,
  input  logic [W-1:0] d,
  output logic [W-1:0] q,
  output logic         wrap
);
  always_ff @(posedge clk or negedge rst_n) begin
    if (!rst_n)
      q <= '0;
    else if (load)
      q <= d;
    else if (en) begin
      if (up) q <= q + 1'b1;
      else    q <= q - 1'b1;
    end
  end
  assign wrap = (q == {W{1'b1}});
endmodule
