// Known-answer design 5: && / || chains in an if, a continuous assign and a nested chain.
module andor (
  input  logic a, b, c, d,
  output logic x, y
);
  always_comb begin
    if (a && b && c) x = 1'b1;
    else             x = 1'b0;
  end
  assign y = (a || d) && c;
endmodule
