module tb;
  reg c, d; wire [3:0] mux_in;
  TopModule uut(.c(c), .d(d), .mux_in(mux_in));
  integer i;
  initial begin
    for (i = 0; i < 8; i = i + 1) begin {c, d} = i[1:0]; #1; end
    for (i = 3; i >= 0; i = i - 1) begin {c, d} = i[1:0]; #1; end
    $finish;
  end
endmodule
