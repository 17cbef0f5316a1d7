// Known-answer design 3: ternaries, nested ifs and an always_comb case.
module alu (
  input  logic [1:0] op,
  input  logic [3:0] a, b,
  input  logic       sat,
  output logic [3:0] y,
  output logic       z
);
  logic [4:0] sum;
  assign sum = a + b;
  always_comb begin
    case (op)
      2'd0: y = sat ? (sum[4] ? 4'hF : sum[3:0]) : sum[3:0];
      2'd1: y = a - b;
      2'd2: begin
        if (a > b) begin
          if (sat) y = a;
          else     y = b;
        end else
          y = 4'h0;
      end
      default: y = a & b;
    endcase
  end
  assign z = (y == 4'h0) ? 1'b1 : 1'b0;
endmodule
