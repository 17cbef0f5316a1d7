module tb;
  reg [3:0] in; wire [3:0] out_both, out_any, out_different;
  TopModule uut(.in(in), .out_both(out_both), .out_any(out_any), .out_different(out_different));
  integer i;
  initial begin
    for (i = 0; i < 32; i = i + 1) begin in = i[3:0]; #1; end
    for (i = 15; i >= 0; i = i - 1) begin in = i[3:0]; #1; end
    $finish;
  end
endmodule
