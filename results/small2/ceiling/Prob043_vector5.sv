module tb;
  reg a,b,c,d,e; wire [24:0] out;
  TopModule uut(.a(a),.b(b),.c(c),.d(d),.e(e),.out(out));
  integer i;
  initial begin
    for (i = 0; i < 64; i = i + 1) begin {a,b,c,d,e} = i[4:0]; #1; end
    $finish;
  end
endmodule
