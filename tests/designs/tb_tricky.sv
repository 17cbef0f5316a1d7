`timescale 1ns/1ps
module tb;
  reg clk = 0, rst = 1; reg [3:0] a = 0, b = 0; reg [1:0] sel = 0;
  wire [3:0] y; wire [1:0] enc; wire v;
  tricky uut (.clk(clk), .rst(rst), .a(a), .b(b), .sel(sel), .y(y), .enc(enc), .v(v));
  always #5 clk = ~clk;
  integer i;
  initial begin
    #12 rst = 0;
    for (i = 0; i < 40; i = i + 1) begin
      @(negedge clk) a = $random; b = $random; sel = $random;
    end
    $finish;
  end
endmodule
